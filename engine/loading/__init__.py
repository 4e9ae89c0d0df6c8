"""engine.loading."""
