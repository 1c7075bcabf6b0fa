"""Forget (signed receipt) and late quarantine."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from fak.api import models as m
from fak.api.deps import ADMIN, AGENT, AUDITOR, kernel
from fak.api.keys import Principal
from fak.kernel.facade import Kernel

router = APIRouter(prefix="/v1", tags=["forget"])


@router.post("/forget", response_model=dict)
def forget(body: m.ForgetIn, who: Principal = Depends(ADMIN), k: Kernel = Depends(kernel)) -> dict:  # noqa: B008
    """Erase a ref from every session, cache and store of the caller's tenant; the signed
    receipt verifies offline (``fak audit verify-receipt``). It answers once the erasure is done;
    the independent replay of each session's survivors follows (``replay_event`` null until
    then: ``GET /v1/forget/{request_id}`` serves the receipt with it). Repeating it returns
    the receipt as it stands."""
    receipt = k.forget(who.tenant, body.ref, requested_by=f"key:{who.key_id}", reason=body.reason)
    return receipt.model_dump(mode="json")


@router.get("/forget/{request_id}", response_model=dict)
def get_forget(request_id: str, who: Principal = Depends(AUDITOR), k: Kernel = Depends(kernel)) -> dict:  # noqa: B008
    st = k.forget_status(who.tenant, request_id)
    if st.receipt is None:
        return {"request_id": st.request_id, "ref": st.ref, "state": st.state}
    return st.receipt.model_dump(mode="json") | {"state": st.state, "replay": st.receipt.replay}


@router.post("/quarantine", response_model=m.QuarantineOut)
def quarantine(body: m.QuarantineIn, who: Principal = Depends(AGENT),  # noqa: B008
               k: Kernel = Depends(kernel)) -> m.QuarantineOut:  # noqa: B008
    """A late detection: evict the ref from every live session of the tenant; refused after."""
    r = k.quarantine(who.tenant, body.ref, reason=body.reason, principal=f"key:{who.key_id}")
    return m.QuarantineOut(ref=r.ref, units=r.units, mode=r.mode, audit_index=r.audit_index,
                           pending=r.pending)
