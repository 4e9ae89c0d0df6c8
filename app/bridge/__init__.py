"""app.bridge."""
