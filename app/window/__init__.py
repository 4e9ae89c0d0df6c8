"""app.window."""
