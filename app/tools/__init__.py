"""Tools in the chat: the app's seam to ``engine/mcp`` (the MCP servers of ``mcp.json``, their states, approvals)."""
