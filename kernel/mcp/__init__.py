"""MCP servers the deployment declares (docs/mcp.md): connections that fak holds open
(``client``), the servers by label (``servers``) and the tool descriptions an operator pinned
(``pins``). A mechanism and its records: what a call may do is decided by the policy, in
``fak.kernel.calls``, before anything here runs it."""
