"""Typed results of the SDK: the API's own response bodies (the wire models of
``fak.wire``, which the server declares too), re-exported, plus the few shapes only the
SDK has. Both modes (HTTP and in-process) return these classes, so results compare equal
across modes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from fak.audit.receipt import ForgetReceipt, ReceiptCheck
from fak.wire import (
    AdmissionOut,
    CheckpointOut,
    EntriesOut,
    EntryOut,
    EvictionOut,
    GenerateOut,
    HeldCallList,
    HeldCallOut,
    InclusionOut,
    MatchOut,
    MaterialiseOut,
    PieceOut,
    QuarantineOut,
    ReceiptCheckOut,
    RefsEvictedOut,
    SegmentOut,
    SessionList,
    SessionOut,
    ToolCallApprovalOut,
    ToolCallDecisionOut,
)

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
    "RefsEvictedOut",
    "HeldCallList",
    "HeldCallOut",
    "ToolCallApprovalOut",
    "ToolCallDecisionOut",
    "SegmentOut",
    "SessionList",
    "SessionOut",
    "StreamDone",
    "Verdict",
    "CheckpointOut",
    "EntriesOut",
    "EntryOut",
    "InclusionOut",
    "ReceiptCheckOut",
]

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
