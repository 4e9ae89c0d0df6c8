"""app.data."""
