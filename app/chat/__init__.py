"""app.chat."""
