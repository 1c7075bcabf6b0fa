"""The audit log as C2SP tlog-tiles: ``/v1/audit/log/checkpoint`` and
``/v1/audit/log/tile/...`` (hash tiles and entry bundles), for standard tiles clients and
``fak audit verify --tiles``.

Who may read (docs/audit.md, "The log as tiles"): by default only the ``operator_tenant``'s
auditor or admin keys. A level-0 hash tile is every entry's leaf hash: it shows another
tenant's activity over time and confirms a guessed entry offline (an entry whose fields are
few and guessable), so the checkpoint and hash tiles go to every tenant's auditors only with
``audit_tiles_tenants: all``; a tenant verifies its own entries from its export and proofs.
Entry bundles hold every tenant's entries (content-free, but tenant names, ids, keyed digests
and times): the operator tenant's keys only, whatever that setting. ``audit_tiles_public``
serves all of it to anyone: a deployment that chooses a public log.

Caching: full tiles and bundles never change (``immutable``, a year); a partial one a
minute, the checkpoint a few seconds. Behind a key they are ``private`` (a shared cache must
not hand a keyed answer to a caller without the key); a public log's are ``public``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from fak.api.deps import AUDITOR, kernel, principal
from fak.api.keys import Principal
from fak.audit import store
from fak.audit import tiles as t
from fak.audit.errors import AuditError
from fak.errors import Forbidden, InvalidInput, NotFound
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/audit/log", tags=["audit"])

IMMUTABLE = "max-age=31536000, immutable"
PARTIAL = "max-age=60"
CHECKPOINT = "max-age=5"
OCTETS = "application/octet-stream"


def reader(request: Request) -> Principal | None:
    """An auditor or admin key of the operator tenant, or of any tenant with
    ``audit_tiles_tenants: all`` (401, or 403 for another role, logged as every route's; 403 for
    another tenant), or nobody at all when the deployment serves a public log
    (``audit_tiles_public``)."""
    settings = kernel(request).settings
    if settings.audit_tiles_public:
        return None
    who: Principal = AUDITOR(request, principal(request))
    if settings.audit_tiles_tenants != "all" and who.tenant != settings.operator_tenant:
        raise Forbidden("the log's checkpoint and hash tiles go to the operator tenant's auditor or admin keys "
                        "(audit_tiles_tenants: operator): verify your entries from GET /v1/audit/export and "
                        "the proof routes")
    return who


def _cache(k: Kernel, lifetime: str) -> dict[str, str]:
    scope = "public" if k.settings.audit_tiles_public else "private"
    return {"Cache-Control": f"{scope}, {lifetime}"}


def _signed_size(k: Kernel) -> tuple[int, str]:
    """The latest signed checkpoint's size and note (with cosignatures); 404 before the first.
    Tiles are served only up to it: what a client fetches is what a signature covers."""
    k.audit.require_verified()
    cp = k.audit.latest_checkpoint()
    if cp is None:
        raise NotFound("the audit log has signed no checkpoint yet")
    return cp.size, cp.note


@router.get("/checkpoint", responses={200: {"content": {"text/plain": {}}}}, response_class=Response)
def checkpoint(who: Principal | None = Depends(reader), k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """The latest signed checkpoint note, with its witnesses' cosignature lines (C2SP
    tlog-checkpoint; it is not re-signed here: the log signs as it grows)."""
    _size, signed = _signed_size(k)
    return Response(signed, media_type="text/plain; charset=utf-8", headers=_cache(k, CHECKPOINT))


@router.get("/tile/{path:path}", responses={200: {"content": {OCTETS: {}}}}, response_class=Response)
def tile(path: str = Path(..., max_length=200, description="<L>/<N>[.p/<W>] or entries/<N>[.p/<W>]"),
         who: Principal | None = Depends(reader), k: Kernel = Depends(kernel)) -> Response:  # noqa: B008
    """A hash tile (``<L>/<N>[.p/<W>]``) or an entry bundle (``entries/<N>[.p/<W>]``) of the
    signed tree; N is 3-digit elements, all but the last prefixed ``x`` (``x001/x234/067``)."""
    try:
        want = t.parse_path("tile/" + path)
    except t.TilePathError as exc:
        raise InvalidInput(str(exc)) from None
    if want.entries and who is not None and who.tenant != k.settings.operator_tenant:
        raise Forbidden("entry bundles hold every tenant's entries: only the operator tenant's auditor or admin "
                        "keys read them (hash tiles and the checkpoint are served to every auditor)")
    size, _note = _signed_size(k)
    try:
        t.check_served(want, size)
        with k.audit.read_snapshot() as conn:
            if want.entries:
                start = want.index * t.TILE_WIDTH
                rows = list(store.entry_rows(conn, start, start + want.width, None))
                if [i for i, _b in rows] != list(range(start, start + want.width)):
                    raise AuditError(f"audit entries of {want.path()} are missing from the database")
                body = t.bundle_bytes([b for _i, b in rows])
            else:
                body = t.tile_bytes(want, size, lambda ids: store.get_nodes(conn, ids))
    except t.TileNotFound as exc:
        raise NotFound(str(exc)) from None
    return Response(body, media_type=OCTETS, headers=_cache(k, PARTIAL if want.partial else IMMUTABLE))
