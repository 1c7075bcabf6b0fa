"""CAS refs of the caller's tenant: ``HEAD`` (metadata) and ``GET`` (the verified bytes).

A digest the tenant never held, or that only another tenant holds, is a 404 (the same
answer either way). A ref the tenant itself forgot is a 410 ``forgotten``: its key and
ciphertext are destroyed, and saying so tells the tenant nothing about anyone else.
The bytes are untrusted tool output: they are served as an attachment, never sniffed
and sandboxed, so a browser does not render them as a page of this origin."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from fak.api.deps import AGENT, READER, caller, kernel
from fak.api.keys import Principal
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/refs", tags=["refs"])


def _not_modified(request: Request, digest: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")]
    return f'"{digest}"' in tags or "*" in tags


@router.head("/{digest}", responses={200: {"description": "the ref exists (headers only)"}})
def head_ref(digest: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """Size (``Content-Length``), media type and taint of one of the tenant's refs."""
    ref = ops.find_ref(k, caller(who), digest)
    return Response(status_code=200, headers=ops.ref_headers(ref) | {"Content-Length": str(ref.size)})


@router.get("/{digest}", responses={200: {"content": {"application/octet-stream": {}}}, 304: {}})
def get_ref(digest: str, request: Request, who: Principal = Depends(AGENT),  # noqa: B008
            k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """The ref's bytes with its media type; ``ETag`` is the quoted digest. Bytes are
    verified (hash, size, authentication tags) before the first one is sent."""
    c = caller(who)
    ref = ops.find_ref(k, c, digest)
    headers = ops.ref_headers(ref)
    if _not_modified(request, ref.digest):
        return Response(status_code=304, headers={n: v for n, v in headers.items() if n != "Content-Type"})
    return Response(content=ops.ref_content(k, c, ref), headers=headers)
