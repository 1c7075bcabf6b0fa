"""CAS refs of the caller's tenant: ``HEAD`` (metadata) and ``GET`` (the verified bytes).

A digest the tenant never held, or that only another tenant holds, is a 404 (the same
answer either way). A ref the tenant itself forgot is a 410 ``forgotten``: its key and
ciphertext are destroyed, and saying so tells the tenant nothing about anyone else.
The bytes are untrusted tool output: they are served as an attachment, never sniffed
and sandboxed, so a browser does not render them as a page of this origin."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from fak.api.deps import AGENT, READER, kernel
from fak.api.keys import Principal
from fak.cas.digest import parse_digest
from fak.cas.errors import Forgotten
from fak.errors import NotFound
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/refs", tags=["refs"])


def _ref(k: Kernel, tenant: str, digest: str):  # noqa: ANN202 - fak.cas.models.Ref
    parse_digest(digest)  # 400 invalid_digest, before any lookup
    ref = k.store.head(digest, tenant)
    if ref is None:
        raise NotFound(f"no ref {digest}")
    if ref.state != "live":
        raise Forgotten(f"ref {digest} was forgotten: its key and ciphertext were destroyed")
    return ref


def _headers(ref) -> dict[str, str]:  # noqa: ANN001
    return {
        "Content-Type": ref.media_type,  # as stored: no charset is claimed for the bytes
        "ETag": f'"{ref.digest}"',
        "Cache-Control": "private, max-age=31536000, immutable",  # content-addressed: never changes
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Content-Disposition": "attachment",
        "X-Fak-Taint": ref.taint,
    }


def _not_modified(request: Request, digest: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")]
    return f'"{digest}"' in tags or "*" in tags


@router.head("/{digest}", responses={200: {"description": "the ref exists (headers only)"}})
def head_ref(digest: str, who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """Size (``Content-Length``), media type and taint of one of the tenant's refs."""
    ref = _ref(k, who.tenant, digest)
    return Response(status_code=200, headers=_headers(ref) | {"Content-Length": str(ref.size)})


@router.get("/{digest}", responses={200: {"content": {"application/octet-stream": {}}}, 304: {}})
def get_ref(digest: str, request: Request, who: Principal = Depends(AGENT),  # noqa: B008
            k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """The ref's bytes with its media type; ``ETag`` is the quoted digest. Bytes are
    verified (hash, size, authentication tags) before the first one is sent."""
    ref = _ref(k, who.tenant, digest)
    if _not_modified(request, ref.digest):
        return Response(status_code=304, headers={n: v for n, v in _headers(ref).items() if n != "Content-Type"})
    data = k.store.get(ref.digest, who.tenant)  # NotFound / Forgotten if a forget won the race
    return Response(content=data, headers=_headers(ref))
