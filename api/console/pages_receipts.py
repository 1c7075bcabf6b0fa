"""The console's receipt pages: a forget's receipt as it stands (with its replay once logged)
and a pasted receipt, each verified against the log's pinned key."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from fak.api.console import auth
from fak.api.console.common import page, post_page, render
from fak.audit.receipt import verify_receipt
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel
from fak.kernel.session.caller import Caller
from fak.wire import ForgetPendingOut

router = APIRouter(prefix="/console", include_in_schema=False)


def _replays(receipt: dict[str, Any]) -> dict[str, str | None]:
    """Each session's replay fingerprint: inline (older receipts) or from the logged
    ``replay_verified`` event the completed receipt carries (verified with it)."""
    out: dict[str, str | None] = {}
    for x in receipt.get("sessions") or []:
        if isinstance(x, dict) and x.get("fingerprint_replay"):
            out[str(x.get("session_id"))] = x["fingerprint_replay"]
    event = receipt.get("replay_event")
    if isinstance(event, str):
        try:
            for x in json.loads(event).get("sessions", []):
                out[str(x.get("session_id"))] = x.get("fingerprint_replay")
        except (ValueError, AttributeError):
            pass  # verify_receipt has said what is wrong with it
    return out


def receipt_page(request: Request, s: auth.ConsoleSession, k: Kernel, receipt: dict[str, Any] | None,
                  problem: str | None = None, status: int = 200) -> HTMLResponse:
    check = verify_receipt(receipt, k.audit.public_key()) if receipt is not None else None
    return render(request, "receipt.html", status, s=s, receipt=receipt, check=check, problem=problem,
                  pubkey=k.audit.public_key(), replays=_replays(receipt) if receipt is not None else {},
                  pasted=json.dumps(receipt, indent=2) if receipt is not None else "")


@router.get("/receipts/{request_id}")
def receipt_of(request_id: str, request: Request) -> Response:
    """A forget's receipt as it stands now (with its replay once logged), verified."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel) -> Response:
        st = ops.forget_status(k, c, request_id)
        if isinstance(st, ForgetPendingOut):
            return render(request, "forget_pending.html", s=s, forget=st.model_dump())
        # forget_status adds these beside the receipt's own fields
        return receipt_page(request, s, k, st.model_dump(mode="json", exclude={"state", "replay"}))

    return page(request, (), run)


@router.get("/receipts")
def receipts(request: Request) -> Response:
    return page(request, (), lambda s, c, k: receipt_page(request, s, k, None))


@router.post("/receipts")
async def receipts_verify(request: Request) -> Response:
    """A pasted receipt, verified against this log's pinned key (as ``fak audit verify-receipt``)."""
    def run(s: auth.ConsoleSession, c: Caller, k: Kernel, form: dict[str, str]) -> Response:
        try:
            receipt = json.loads(form.get("receipt", ""))
        except ValueError as e:
            return receipt_page(request, s, k, None, f"not JSON: {e}", 400)
        if not isinstance(receipt, dict):
            return receipt_page(request, s, k, None, "a receipt is a JSON object", 400)
        return receipt_page(request, s, k, receipt)

    return await post_page(request, (), run)
