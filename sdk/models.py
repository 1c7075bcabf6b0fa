"""Typed results of the SDK: the API's own response bodies (``fak.api.models``),
re-exported, plus the few shapes only the SDK has. Both modes (HTTP and in-process)
return these classes, so results compare equal across modes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from fak.api.models import (
    AdmissionOut,
    EvictionOut,
    GenerateOut,
    MatchOut,
    MaterialiseOut,
    PieceOut,
    QuarantineOut,
    SegmentOut,
    SessionList,
    SessionOut,
)
from fak.audit.receipt import ForgetReceipt, ReceiptCheck

if TYPE_CHECKING:
    from fak.api.routes.audit import CheckpointOut, EntriesOut, EntryOut, InclusionOut, ReceiptCheckOut

Verdict = Literal["ALLOW", "QUARANTINE", "REDACT", "DENY"]

__all__ = [
    "AdmissionOut",
    "EvictionOut",
    "ForgetReceipt",
    "ForgetStatus",
    "GenerateOut",
    "MatchOut",
    "MaterialiseOut",
    "PieceOut",
    "QuarantineOut",
    "ReceiptCheck",
    "SegmentOut",
    "SessionList",
    "SessionOut",
    "StreamDone",
    "Verdict",
    # audit bodies (imported on first use, see __getattr__)
    "CheckpointOut",
    "EntriesOut",
    "EntryOut",
    "InclusionOut",
    "ReceiptCheckOut",
]

_AUDIT = ("CheckpointOut", "EntriesOut", "EntryOut", "InclusionOut", "ReceiptCheckOut")


def __getattr__(name: str) -> Any:
    """The audit routes' response bodies. They are defined beside the routes
    (``fak.api.routes.audit``), whose import loads the kernel (torch), so they are
    imported only when an audit call first needs them; ``fak.api.models`` wins if it
    defines them."""
    if name in _AUDIT:
        import fak.api.models as api_models

        if hasattr(api_models, name):
            return getattr(api_models, name)
        from fak.api.routes import audit

        return getattr(audit, name)
    raise AttributeError(f"module 'fak.sdk.models' has no attribute {name!r}")


class StreamDone(BaseModel):
    """The end of a streamed generation: the assistant segment it appended (None if the
    model stopped at once) and the session's KV fingerprint after it."""

    segment: SegmentOut | None
    fingerprint: str


class ForgetStatus(BaseModel):
    """``GET /v1/forget/{request_id}``: the receipt once the forget completed."""

    request_id: str
    ref: str
    state: str  # requested | completed
    receipt: ForgetReceipt | None = None
