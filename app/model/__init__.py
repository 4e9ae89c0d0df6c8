"""app.model."""
