"""Audit: the caller tenant's entries, signed checkpoints, inclusion and consistency
proofs, a streamed export with proofs, and forget-receipt verification.

The log is one Merkle tree shared by every tenant. A tenant reads only its own rows
(an index of another tenant's row answers exactly as an index nobody wrote); what is
global is the tree's structure: its size, roots and the proof hashes, which are
hashes of subtrees and reveal no event content.

While the log's signer is in alarm (the database's history disagrees with what it signed),
every route here that presents entries, checkpoints or proofs answers 409
``audit_unverified`` with the alarm's kind, rather than serve a rewritten history as the log;
``/receipts/verify`` still answers (it needs only the pinned key).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from fastapi import APIRouter, Body, Depends, Path, Query
from fastapi.responses import PlainTextResponse, StreamingResponse

from fak.api.deps import AUDITOR, READER, kernel
from fak.api.keys import Principal
from fak.api.models import CheckpointOut, EntriesOut, EntryOut, InclusionOut, ReceiptCheckOut
from fak.audit.signer_state import SignerRefused
from fak.audit.tenant_export import FORMAT, tenant_export_lines
from fak.errors import InvalidInput, NotFound
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1/audit", tags=["audit"])

MAX_INDEX = 2**53 - 1  # indexes are exact in JSON numbers (and far below BIGINT and SQLite INTEGER)
MAX_LIMIT = 1000
EXPORT_FORMAT = FORMAT  # fak-tenant-audit-export/v2: docs/api.md, "Audit export"


@contextmanager
def _verified(k: Kernel) -> Iterator[None]:
    """Refuse (AuditUnverified, 409) while the signer is in alarm, including an alarm that the
    signature asked for inside the block raises (a rewrite found out just now)."""
    k.audit.require_verified()
    try:
        yield
    except SignerRefused:
        k.audit.require_verified()
        raise


def _entry_out(e) -> EntryOut:  # noqa: ANN001 - fak.audit.log.LogEntry
    return EntryOut(index=e.index, type=e.event.type, event=e.body.decode(), leaf_hash=e.leaf_hash.hex())


def _own_entry(k: Kernel, tenant: str, index: int):  # noqa: ANN202 - LogEntry
    """The entry at ``index`` if it is the tenant's; otherwise the same NotFound as past the end."""
    found = list(k.audit.entries(tenant, index, index + 1)) if index < k.audit.size() else []
    if not found:
        raise NotFound(f"no audit entry at index {index}")
    return found[0]


@router.get("/entries", response_model=EntriesOut)
def entries(start: int = Query(0, ge=0, le=MAX_INDEX, description="first log index to consider"),
            limit: int = Query(100, ge=1, le=MAX_LIMIT, description="most entries returned"),
            who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> EntriesOut:  # noqa: B008
    """The caller tenant's entries with index >= ``start``, in index order (indexes of
    other tenants' entries are skipped, so a page's indexes are not contiguous)."""
    with _verified(k):
        it = k.audit.entries(who.tenant, start, None)
        try:
            rows = list(itertools.islice(it, limit + 1))
        finally:
            it.close()  # type: ignore[attr-defined] - releases the read connection
    more = len(rows) > limit
    rows = rows[:limit]
    return EntriesOut(entries=[_entry_out(e) for e in rows], next_start=rows[-1].index + 1 if more else None)


def _checkpoint_out(k: Kernel, cp) -> CheckpointOut:  # noqa: ANN001 - SignedCheckpoint
    return CheckpointOut(origin=cp.origin, size=cp.size, root_hash=cp.root.hex(), checkpoint=cp.note,
                         public_key=k.audit.public_key())


@router.get("/checkpoint", response_model=CheckpointOut)
def checkpoint(who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> CheckpointOut:  # noqa: B008
    """The latest signed checkpoint (one is signed now if the tree grew since the last)."""
    with _verified(k):
        return _checkpoint_out(k, k.audit.checkpoint())


@router.get("/proof/inclusion/{index}", response_model=InclusionOut,
            responses={200: {"content": {"text/plain": {}}}})
def inclusion(index: int = Path(..., ge=0, le=MAX_INDEX), format: Literal["json", "tlog"] = "json",  # noqa: A002 - the query parameter's name
              who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)):  # noqa: ANN201, B008
    """Proof that the caller's entry ``index`` is in the first signed checkpoint covering
    it; ``?format=tlog`` gives the C2SP tlog-proof text instead of JSON."""
    with _verified(k):
        entry = _own_entry(k, who.tenant, index)
        proof = k.audit.inclusion_proof(index)
    if format == "tlog":
        return PlainTextResponse(proof.to_tlog_proof(), media_type="text/plain; charset=utf-8")
    return InclusionOut(index=index, leaf_hash=entry.leaf_hash.hex(), proof=proof.to_json())


@router.get("/proof/consistency", response_model=dict)
def consistency(first: int = Query(..., ge=0, le=MAX_INDEX, description="the older tree size"),
                second: int | None = Query(None, ge=0, le=MAX_INDEX, description="the newer size (default: now)"),
                who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> dict:  # noqa: B008
    """RFC 9162 consistency proof between two tree sizes (roots and subtree hashes only)."""
    with _verified(k):
        size = k.audit.size()
        second = size if second is None else second
        if not first <= second <= size:
            raise InvalidInput(f"need 0 <= first <= second <= {size} (the log size), got first={first}, "
                               f"second={second}")
        return k.audit.consistency_proof(first, second).to_json()


@router.get("/export", responses={200: {"content": {"application/x-ndjson": {}}}})
def export(who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> StreamingResponse:  # noqa: B008
    """The caller tenant's entries as JSON lines, each with its inclusion proof against
    one signed checkpoint (the first line). Format: docs/api.md, "Audit export"."""
    return StreamingResponse(export_lines(k, who.tenant), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-store"})


def export_lines(k: Kernel, tenant: str) -> Iterator[bytes]:
    """The export's lines (fak.audit.tenant_export, format ``EXPORT_FORMAT``): the checkpoint
    and the statement of the tenant's count are signed now, before the first byte is sent (an
    error here is an error response, not a cut stream); the entries follow lazily."""
    with _verified(k):
        return tenant_export_lines(k.audit, tenant)


@router.post("/receipts/verify", response_model=ReceiptCheckOut)
def verify_receipt(receipt: dict = Body(..., description="a forget receipt as returned by POST /v1/forget"),  # noqa: B008
                   who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> ReceiptCheckOut:  # noqa: B008
    """Check a forget receipt with this server's pinned log key (as ``fak audit
    verify-receipt --pubkey`` does offline): ``ok`` false says why, it is not an error."""
    from fak.audit.receipt import verify_receipt as check

    result = check(receipt, k.audit.public_key())
    return ReceiptCheckOut(ok=result.ok, reason=result.reason)
