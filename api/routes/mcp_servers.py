"""The deployment's MCP servers and their pinned tools (docs/mcp.md, "Declaring servers and
pinning their tools"): thin adapters over ``fak.kernel.operations``. Admin keys of the operator
tenant only (the servers and the pins are the deployment's, not a tenant's): every other key
is refused (403)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

from fak import wire as w
from fak.api.deps import ADMIN, caller, kernel
from fak.api.keys import Principal
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/mcp/servers", tags=["mcp"])

LABEL = Path(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$", description="the server's label in mcp_servers")


@router.get("", response_model=w.McpServerList)
def list_servers(who: Principal = Depends(ADMIN), k: Kernel = Depends(kernel)) -> w.McpServerList:  # noqa: B008
    """Every declared MCP server: its source, its tools as it lists them now (name, digest,
    description, input schema) with each one's status against the pins (``pinned``, ``changed``
    with what changed, ``not_pinned``, ``not_allowed``), and the pins with who approved them. A
    server that cannot be listed shows its ``error``. Logs nothing."""
    return ops.mcp_servers(k, caller(who))


@router.post("/{label}/approve", response_model=w.McpApproveOut)
def approve(body: w.McpApproveIn | None = None, label: str = LABEL, who: Principal = Depends(ADMIN),  # noqa: B008
            k: Kernel = Depends(kernel)) -> w.McpApproveOut:  # noqa: B008
    """Pin the server's tools as it lists them now (``mcp_tools_approved`` is logged first, naming
    the key); with ``expected`` (the digests reviewed), only that exact listing (409 when the server
    changed since, nothing pinned). A tool whose description changes later is withheld from
    models until approved again."""
    return ops.mcp_approve(k, caller(who), label, body)
