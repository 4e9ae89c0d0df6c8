"""engine.tools."""
