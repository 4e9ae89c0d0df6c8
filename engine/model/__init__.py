"""engine.model."""
