"""The MCP host: ``mcp.json`` servers (``config``), their lifecycle and calls (``host``), the user's answers
(``approvals``) and the tool loop over an engine (``loop``). Torch-free but for the loop, which drives an ``LLM``."""
