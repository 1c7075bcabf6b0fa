"""A tool result's admission, the policy's half (``KernelSession.admit`` runs it inside its
transaction and owns the ledger change between the halves).

Before the change: what the bytes are (their CAS ref), what the policy decides of them (the
gate, or a late quarantine that already judged them, or a forget that erased them: a resend
must not undo either), what enters
attention (REDACT: the redacted bytes under their own ref, linked to the original so a
forget of either finds both), for how long, and the audit event, validated before anything
changes. After the event is logged: the records later decisions read (ref metadata, CAS
uses, producers, the next expiry, taint) and the hand-off to the late detectors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fak.audit import AdmissionVerdict
from fak.errors import Conflict, InvalidInput
from fak.kernel.kv.ledger import Segment, SegmentState
from fak.kernel.services import Services
from fak.kernel.withdrawal.quarantine import lifetime
from fak.policy import GateContext, Policy, Verdict, VerdictKind
from fak.policy.late import LateJob
from fak.state.store import now_us
from fak.types import as_id, check_id

__all__ = ["FORGOTTEN_RULE", "MAX_MEDIA_TYPE", "MAX_SOURCE", "QUARANTINED_RULE", "Admission", "Decided",
           "RefBeingForgotten", "ToolResult", "base_media_type", "decide", "forgotten", "late_check", "record",
           "tool_result"]

MAX_SOURCE = 2048  # characters of a tool result's source URL
QUARANTINED_RULE = "ref_quarantined"  # the rule of an admission refused because of a late quarantine
FORGOTTEN_RULE = "ref_forgotten"  # the rule of an admission refused because its bytes were forgotten


class RefBeingForgotten(Conflict):
    """An admission of bytes whose ref has a forget in progress (it would outlive the shred)."""

    code = "ref_being_forgotten"


@dataclass(frozen=True)
class Admission:
    """What became of one tool result."""

    verdict: Verdict  # the gate's verdict (rule, policy digest, matches)
    ref: str  # CAS ref of the bytes as given
    admitted_ref: str | None  # the ref whose bytes entered attention (REDACT: the redacted bytes)
    segment: Segment
    audit_index: int

    @property
    def admitted(self) -> bool:
        return self.segment.live


@dataclass(frozen=True)
class ToolResult:
    """A tool result as given, checked."""

    tool: str
    data: bytes
    media_type: str
    tags: list[str]
    source: str | None  # the URL it came from (rules, exceptions and trust may depend on its host)

    @property
    def base_media_type(self) -> str | None:
        """The media type without parameters, lower case, as the segment records it (None for
        one too long to be a real type)."""
        return base_media_type(self.media_type)


MAX_MEDIA_TYPE = 128


def base_media_type(media_type: str | None) -> str | None:
    """``Application/JSON; charset=utf-8`` → ``application/json``; None if absent or too long."""
    base = (media_type or "").split(";", 1)[0].strip().lower()
    return base if base and len(base) <= MAX_MEDIA_TYPE else None


def tool_result(tool: object, data: object, media_type: str, tags: Sequence[str], source: object) -> ToolResult:
    """Check a tool result's parts (a client's input: wrong types are refused, not trusted)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidInput("a tool result is bytes")
    data = bytes(data)
    if not isinstance(tool, str) or not tool:
        raise InvalidInput("tool must be a non-empty string")
    checked = [check_id(t) for t in tags]
    if source is not None and (not isinstance(source, str) or len(source) > MAX_SOURCE or not source.isprintable()):
        raise InvalidInput(f"source is a URL of at most {MAX_SOURCE} printable characters")
    return ToolResult(tool, data, media_type, checked, source)


@dataclass(frozen=True)
class Decided:
    """What the policy made of one tool result, before the ledger changes."""

    result: ToolResult
    policy: Policy  # the policy that decided it (a reload meanwhile does not mix two)
    verdict: Verdict
    ref: str  # of the bytes as given
    admitted_ref: str | None  # the ref whose bytes enter attention; None: they do not
    body: bytes  # what enters attention (REDACT: the redacted bytes)
    expires_us: int | None  # when the admitted ref expires (None: no time limit)
    turns: int | None  # model turns it stays (None: no turn limit)
    stored: bool = True  # False: refused unstored (a forgotten ref: nothing of it may be kept again)

    @property
    def admitted(self) -> bool:
        return self.admitted_ref is not None

    def event(self, tenant: str, session_id: str, segment_id: str) -> AdmissionVerdict:
        """The audit event of this admission as segment ``segment_id`` (validated when built)."""
        verdict = self.verdict
        return AdmissionVerdict(
            tenant=tenant, session_id=session_id, segment_id=segment_id, tool=as_id(self.result.tool), ref=self.ref,
            size=len(self.result.data), verdict=verdict.kind.value, rule_id=as_id(verdict.rule_id),
            policy_digest=verdict.policy_digest,
            admitted_ref=self.admitted_ref if self.admitted_ref != self.ref else None, trust=verdict.trust,
            audited=[as_id(a.rule_id) for a in verdict.audited],
            exempted=sorted({as_id(e.exception_id) for e in verdict.exempted}),
        )  # fmt: skip


def forgotten(services: Services, tenant: str, ref: str) -> bool:
    """Whether ``ref`` (the tenant's keyed digest of some bytes) names bytes a forget erased, or
    is erasing, and that were not admitted again since: a forget of it (or of a ref linked to
    it) is in progress, or the CAS holds its tombstone (the keyed digest, never the bytes), or
    a forget row names it and its bytes are not live. A tenant erase destroys the digest key:
    the same bytes then get another ref, which no tombstone names (the tenant starts anew)."""
    pending, covering = services.state.forget_standing(tenant, ref)  # one read
    if pending:
        return True
    head = services.store.head(ref, tenant)
    if head is not None:
        return head.state != "live"
    return covering is not None


def _refused_forgotten(result: ToolResult, policy: Policy, ref: str, *, stored: bool) -> Decided:
    """QUARANTINE ``ref_forgotten``, decided before the gate reads the bytes (in audit mode too:
    a forget is an erasure, not a detection)."""
    verdict = Verdict(kind=VerdictKind.QUARANTINE, rule_id=FORGOTTEN_RULE, policy_digest=policy.digest,
                      tool=result.tool, input_bytes=len(result.data))
    return Decided(result, policy, verdict, ref, None, b"", None, None, stored=stored)


def decide(services: Services, tenant: str, session_id: str, result: ToolResult) -> Decided:
    """Store the bytes and decide on them under the active policy (the session's lock is held).
    Bytes of a forgotten ref are refused unstored unless the policy allows re-admission
    (``spec.forget.readmit``); a forget in progress refuses them either way."""
    state, store, policy = services.state, services.store, services.policy
    data, tool = result.data, result.tool
    readmit = policy.spec.forget.readmit
    ref = store.digest_of(data, tenant)
    if readmit and state.forget_pending(tenant, ref):
        raise RefBeingForgotten("these bytes are being forgotten; admit them again once the forget completed")
    if not readmit and forgotten(services, tenant, ref):
        return _refused_forgotten(result, policy, ref, stored=False)
    ref = store.put(data, result.media_type, tenant).digest
    meta = state.ref(tenant, ref)
    if meta is not None and meta.quarantined:
        # a late detection already judged these bytes: a resend must not undo it
        verdict = Verdict(kind=VerdictKind.QUARANTINE, rule_id=QUARANTINED_RULE, policy_digest=policy.digest,
                          tool=tool, input_bytes=len(data))
    else:
        verdict = services.gate(policy, tool, data, GateContext(media_type=result.media_type, source=result.source,
                                                                tenant=tenant, session=session_id, ref=ref))
    kind = verdict.kind if verdict.enforced else VerdictKind.ALLOW
    admitted = kind in (VerdictKind.ALLOW, VerdictKind.REDACT)
    body, admitted_ref = data, (ref if admitted else None)
    if kind is VerdictKind.REDACT and verdict.redacted_bytes is not None:
        body = verdict.redacted_bytes
        derived = store.digest_of(body, tenant)
        if derived != ref:
            if readmit and state.forget_pending(tenant, derived):
                raise RefBeingForgotten("the redacted form of these bytes is being forgotten; admit them "
                                        "again once the forget completed")
            if not readmit and forgotten(services, tenant, derived):
                # these bytes are not forgotten themselves (another original, or one whose link is
                # gone), but what would enter attention is: refused, and recorded as any refusal
                return _refused_forgotten(result, policy, ref, stored=True)
            # linked before the redacted bytes are stored: a forget of either form finds both
            state.link_refs(tenant, ref, derived)
        admitted_ref = store.put(body, result.media_type, tenant).digest
    expires_us = turns = None
    if admitted:
        seconds, turns = lifetime(policy, tool, verdict, result.source)
        expires_us = now_us() + seconds * 1_000_000 if seconds is not None else None
    return Decided(result, policy, verdict, ref, admitted_ref, body, expires_us, turns)


def record(services: Services, tenant: str, session_id: str, decided: Decided, segment_id: str, *,
           kv_unit: bool = True) -> None:
    """Record what later decisions read of an admission, once its event is logged: the refs'
    metadata and producers, the CAS use (the KV unit that holds the ref; ``kv_unit`` False: the
    segment holds no KV, a gateway session's), the next expiry; a refused ref's taint. Nothing
    for bytes refused unstored (a forgotten ref: no record of them is made again)."""
    if not decided.stored:
        return
    state, store, result = services.state, services.store, decided.result
    tool, tags, source, kind = result.tool, result.tags, result.source, decided.verdict.kind.value
    producer = (tool, source)
    if decided.admitted_ref is not None:
        state.record_ref(tenant, decided.admitted_ref, tool, tags, kind, decided.policy.digest,
                         expires_us=decided.expires_us, source=source)
        if kv_unit:
            store.record_use(decided.admitted_ref, tenant, "segment", f"{session_id}/{segment_id}")
        services.producers.note(tenant, decided.admitted_ref, producer)
        services.withdrawals.note_expiry(decided.expires_us)
        services.withdrawals.clear(tenant, decided.admitted_ref, SegmentState.EXPIRED)  # admitted again: a new lifetime
    if decided.admitted_ref != decided.ref:
        state.record_ref(tenant, decided.ref, tool, tags, kind, decided.policy.digest, source=source)
        services.producers.note(tenant, decided.ref, producer)
    if not decided.admitted:
        store.set_taint(decided.ref, tenant, "quarantined")


def late_check(services: Services, tenant: str, session_id: str, decided: Decided) -> None:
    """Hand an admitted result to the late detectors, with the trust the gate applied."""
    late = services.late
    if decided.admitted_ref is None or late.runner is None:
        return
    late.submit(LateJob(tenant=tenant, session=session_id, ref=decided.admitted_ref, tool=decided.result.tool,
                        trust=decided.verdict.trust or "untrusted", text=decided.body.decode("utf-8", errors="replace"),
                        admitted_at=time.time()), services.policy)
