"""Forget (signed receipt) and late quarantine: thin adapters over ``fak.kernel.operations``."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from fak import wire as w
from fak.api.deps import ADMIN, AGENT, AUDITOR, caller, kernel
from fak.api.keys import Principal
from fak.kernel import operations as ops
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1", tags=["forget"])


@router.post("/forget", response_model=w.ForgetReceiptOut)
def forget(body: w.ForgetIn, who: Principal = Depends(ADMIN),  # noqa: B008
           k: Kernel = Depends(kernel)) -> w.ForgetReceiptOut:  # noqa: B008
    """Erase a ref from every session, cache and store of the caller's tenant; the signed
    receipt verifies offline (``fak audit verify-receipt``). It answers once the erasure is done;
    the independent replay of each session's survivors follows (``replay_event`` null until
    then: ``GET /v1/forget/{request_id}`` serves the receipt with it). Repeating it returns
    the receipt as it stands."""
    return ops.forget(k, caller(who), body)


@router.get("/forget/{request_id}", response_model=w.ForgetStatusOut | w.ForgetPendingOut)
def get_forget(request_id: str, who: Principal = Depends(AUDITOR),  # noqa: B008
               k: Kernel = Depends(kernel)) -> w.ForgetStatusOut | w.ForgetPendingOut:  # noqa: B008
    """A forget by request id: its receipt as it stands (with the replay once logged), its state
    and the replay's; before its erasure is done (a crash interrupted it), only its state."""
    return ops.forget_status(k, caller(who), request_id)


@router.post("/quarantine", response_model=w.QuarantineOut)
def quarantine(body: w.QuarantineIn, who: Principal = Depends(AGENT),  # noqa: B008
               k: Kernel = Depends(kernel)) -> w.QuarantineOut:  # noqa: B008
    """A late detection: evict the ref from every live session of the tenant; refused after."""
    return ops.quarantine(k, caller(who), body)
