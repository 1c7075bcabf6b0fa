"""What the gate returns. A verdict carries no content of the input (only
offsets, rule ids and the policy digest), so it can go into audit events as is;
``redacted_bytes`` is the one exception and is meant for the kernel, not logs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fak.policy.schema import VerdictKind


class Match(BaseModel):
    """One detector finding. ``start``/``end`` are byte offsets in the original input;
    ``exact`` is false when the finding sits in a decoded layer and the span is the
    whole encoded run that produced it."""

    model_config = ConfigDict(frozen=True)

    rule_id: str
    detector: str
    family: str
    name: str
    start: int
    end: int
    score: float
    exact: bool = True
    layer: str = "text"


class GateContext(BaseModel):
    """Facts about the input the bytes cannot tell: its media type, and ids for the record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    media_type: str | None = None
    tenant: str | None = None
    session: str | None = None
    ref: str | None = None


class Verdict(BaseModel):
    """The gate's decision. In audit mode ``kind`` is ALLOW, ``enforced`` is false and
    ``would_be`` says what enforcement would have done."""

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    kind: VerdictKind
    rule_id: str
    policy_digest: str
    tool: str
    matches: list[Match] = []
    redacted_bytes: bytes | None = None
    enforced: bool = True
    would_be: VerdictKind | None = None
    score: float = 0.0
    input_bytes: int = 0
