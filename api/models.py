"""The API's request and response bodies: the wire models of ``fak.wire``, re-exported under
the name the routes have always imported. They live there, not here, so that the SDK can use
the same classes without importing the server (issue 26 part 5)."""

from __future__ import annotations

from fak.wire import (
    AdmissionOut,
    CheckpointOut,
    EntriesOut,
    EntryOut,
    EvictIn,
    EvictionOut,
    EvictRefsIn,
    ForgetIn,
    ForgetPendingOut,
    ForgetReceiptOut,
    ForgetStatusOut,
    GenerateIn,
    GenerateOut,
    InclusionOut,
    MaterialiseOut,
    MessageIn,
    PieceOut,
    QuarantineIn,
    QuarantineOut,
    ReceiptCheckOut,
    RefsEvictedOut,
    SegmentOut,
    SessionCreate,
    SessionList,
    SessionOut,
    ToolCallDecisionOut,
    ToolCallIn,
    ToolResultIn,
)

__all__ = [
    "AdmissionOut", "CheckpointOut", "EntriesOut", "EntryOut", "EvictIn", "EvictRefsIn", "EvictionOut", "ForgetIn",
    "ForgetPendingOut", "ForgetReceiptOut", "ForgetStatusOut",
    "GenerateIn", "GenerateOut", "InclusionOut", "MaterialiseOut", "MessageIn", "PieceOut", "QuarantineIn",
    "QuarantineOut", "ReceiptCheckOut", "RefsEvictedOut", "SegmentOut", "SessionCreate", "SessionList", "SessionOut",
    "ToolCallDecisionOut", "ToolCallIn", "ToolResultIn",
]
