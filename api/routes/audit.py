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

from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query
from fastapi.responses import PlainTextResponse, StreamingResponse

from fak.api.deps import AUDITOR, READER, caller, kernel
from fak.api.keys import Principal
from fak.audit.tenant_export import FORMAT
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel
from fak.kernel.operations import MAX_INDEX, MAX_LIMIT
from fak.wire import CheckpointOut, EntriesOut, InclusionOut, ReceiptCheckOut

router = APIRouter(prefix="/v1/audit", tags=["audit"])

EXPORT_FORMAT = FORMAT  # fak-tenant-audit-export/v2: docs/api.md, "Audit export"


@router.get("/entries", response_model=EntriesOut)
def entries(start: int = Query(0, ge=0, le=MAX_INDEX, description="first log index to consider"),
            limit: int = Query(100, ge=1, le=MAX_LIMIT, description="most entries returned"),
            who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> EntriesOut:  # noqa: B008
    """The caller tenant's entries with index >= ``start``, in index order (indexes of
    other tenants' entries are skipped, so a page's indexes are not contiguous)."""
    return ops.audit_entries(k, caller(who), start, limit)


@router.get("/checkpoint", response_model=CheckpointOut)
def checkpoint(who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> CheckpointOut:  # noqa: B008
    """The latest signed checkpoint (one is signed now if the tree grew since the last)."""
    return ops.audit_checkpoint(k, caller(who))


@router.get("/proof/inclusion/{index}", response_model=InclusionOut,
            responses={200: {"content": {"text/plain": {}}}})
def inclusion(index: int = Path(..., ge=0, le=MAX_INDEX), format: Literal["json", "tlog"] = "json",  # noqa: A002 - the query parameter's name
              who: Principal = Depends(AUDITOR),  # noqa: B008
              k: Kernel = Depends(kernel)) -> InclusionOut | PlainTextResponse:  # noqa: B008
    """Proof that the caller's entry ``index`` is in the first signed checkpoint covering
    it; ``?format=tlog`` gives the C2SP tlog-proof text instead of JSON."""
    out = ops.audit_inclusion(k, caller(who), index, format)
    if isinstance(out, str):
        return PlainTextResponse(out, media_type="text/plain; charset=utf-8")
    return out


@router.get("/proof/consistency", response_model=dict)
def consistency(first: int = Query(..., ge=0, le=MAX_INDEX, description="the older tree size"),
                second: int | None = Query(None, ge=0, le=MAX_INDEX, description="the newer size (default: now)"),
                who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> dict[str, Any]:  # noqa: B008
    """RFC 9162 consistency proof between two tree sizes (roots and subtree hashes only)."""
    return ops.audit_consistency(k, caller(who), first, second)


@router.get("/export", responses={200: {"content": {"application/x-ndjson": {}}}})
def export(who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> StreamingResponse:  # noqa: B008
    """The caller tenant's entries as JSON lines, each with its inclusion proof against
    one signed checkpoint (the first line). Format: docs/api.md, "Audit export"."""
    return StreamingResponse(ops.audit_export(k, caller(who)), media_type="application/x-ndjson",
                             headers={"Cache-Control": "no-store"})


@router.post("/receipts/verify", response_model=ReceiptCheckOut)
def verify_receipt(receipt: dict[str, Any] = Body(..., description="a forget receipt as returned by POST /v1/forget"),  # noqa: B008
                   who: Principal = Depends(READER), k: Kernel = Depends(kernel)) -> ReceiptCheckOut:  # noqa: B008
    """Check a forget receipt with this server's pinned log key (as ``fak audit
    verify-receipt --pubkey`` does offline): ``ok`` false says why, it is not an error."""
    return ops.verify_receipt(k, caller(who), receipt)
