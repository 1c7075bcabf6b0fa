"""What the gate returns. A verdict carries no content of the input (only
offsets, rule ids and the policy digest), so it can go into audit events as is;
``redacted_bytes`` is the one exception and is meant for the kernel, not logs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from fak.types import VerdictKind  # the shared ground defines it; fak.policy re-exports it


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
    audit: bool = False  # a match of an ``action: audit`` rule: reported, decides nothing


class Audited(BaseModel):
    """An ``action: audit`` rule that fired: the verdict it would have given, had it been enforced."""

    model_config = ConfigDict(frozen=True)

    rule_id: str
    would_be: VerdictKind
    score: float


class Exempted(BaseModel):
    """An operator's exception that took ``findings`` findings away from ``rule_id``;
    ``would_fire``: without the exception the rule would have fired (reached its threshold)."""

    model_config = ConfigDict(frozen=True)

    exception_id: str
    rule_id: str
    findings: int
    would_fire: bool


class GateContext(BaseModel):
    """Facts about the input the bytes cannot tell: its media type, the URL it came from
    (``source``: rules and exceptions may be restricted by its host), and ids for the record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    media_type: str | None = None
    source: str | None = None
    tenant: str | None = None
    session: str | None = None
    ref: str | None = None


class Verdict(BaseModel):
    """The gate's decision. In audit mode ``kind`` is ALLOW, ``enforced`` is false and
    ``would_be`` says what enforcement would have done. ``trust``: the trust level that
    applied to the result (a tool entry may give one only to some source hosts). ``audited``: the ``action: audit``
    rules that fired (they changed nothing); ``exempted``: the operator's exceptions that took
    findings away from a rule."""

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
    trust: str | None = None  # the trust level the gate applied (tool entry, source host, defaults)
    audited: list[Audited] = []
    exempted: list[Exempted] = []
