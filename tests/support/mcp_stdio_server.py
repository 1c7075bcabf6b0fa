"""A tiny MCP server spoken to over stdio (the official SDK's ``MCPServer``), for the tests of a
server the deployment declares by ``command``: ``[sys.executable, this file]``. One tool, ``echo``."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo")


@server.tool(name="echo", description="Echo the text back.")
def echo(text: str) -> str:
    return f"echo: {text}"


if __name__ == "__main__":
    server.run("stdio")
