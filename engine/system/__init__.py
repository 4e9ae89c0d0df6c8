"""engine.system."""
