"""engine.serving."""
