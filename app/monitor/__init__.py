"""app.monitor."""
