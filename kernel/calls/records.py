"""What the audit log and a person see of a tool-call decision.

The log keeps a decision's argument provenance as paths, origins, segments, ref digests and
character offsets (never a value), the model's attention evidence and the counterfactual's
log-probabilities. A person asked to confirm sees the same findings with the field of the
source they came from. An approval is remembered under a key that names the call exactly
(tool, keyed digest of the arguments, the rule, the offending refs in attention and the
triggering sources), so the same call with the same provenance is not asked about twice in
one session, and nothing else is let through (a new untrusted ref in attention included).
"""

from __future__ import annotations

import re

import blake3

from fak import wire as w
from fak.audit import ToolCallDecision as DecisionEvent
from fak.audit.events import (
    ArgumentRecord,
    ArgumentSourceRecord,
    AttentionRecord,
    CounterfactualRecord,
    ToolClassRecord,
)
from fak.kernel.calls.authorize import ToolCallDecision
from fak.kernel.calls.tool_classes import ToolClass
from fak.types import as_id

MAX_CLASS_ITEMS = 256  # routing and content arguments of a tool's class the log keeps (ToolClassRecord)
MAX_SOURCES_LOGGED = 8  # per argument: the most trusted first; the decision itself reads them all
_SAFE_PATH = re.compile(r"[A-Za-z0-9_.:@/+=-]{1,128}")


def safe_path(path: str, index: int) -> str:
    """An argument path or name for the log: itself when it is a plain identifier (a schema's
    key), else its position (a key the model invented may carry content)."""
    return path if _SAFE_PATH.fullmatch(path) else f"@{index}"


def argument_records(decision: ToolCallDecision) -> list[ArgumentRecord]:
    """The decision's argument provenance as the log records it."""
    triggers = {(t.path, t.entity) for t in decision.triggers}
    return [
        ArgumentRecord(
            path=safe_path(t.path, i), origin=t.origin, entity=t.entity,  # type: ignore[arg-type]
            sources=[ArgumentSourceRecord(segment=as_id(s.segment), ref=s.ref, start=s.start, end=s.end,
                                          inside=s.inside)
                     for s in t.sources[:MAX_SOURCES_LOGGED]],
            trigger=(t.path, t.entity) in triggers,
        )
        for i, t in enumerate(decision.arguments[:1024])
    ]


def decision_event(tenant: str, session_id: str, tool: str, digest: str, decision: ToolCallDecision,
                   principal: str | None) -> DecisionEvent:
    """The audit event of a decision (the arguments as a keyed digest and their provenance)."""
    cf = decision.counterfactual
    return DecisionEvent(
        tenant=tenant, session_id=session_id, tool=as_id(tool), args_digest=digest,
        verdict=decision.verdict, rule_id=as_id(decision.rule_id) if decision.rule_id else None,
        offending=list(decision.offending), attention_refs=decision.attention_refs,
        policy_digest=decision.policy_digest, enforced=decision.enforced, would_be=decision.would_be,
        audited=[as_id(r) for r in decision.audited], principal=as_id(principal) if principal else None,
        arguments=argument_records(decision),
        attention=[AttentionRecord(arg=safe_path(arg, i), ref=ref, mean=_unit(m.mean),
                                   per_layer=[_unit(x) for x in m.per_layer])
                   for i, (arg, per) in enumerate(decision.attention.items()) for ref, m in per.items()],
        counterfactual=CounterfactualRecord(
            refs=list(cf.refs), logprob_with={safe_path(k, i): v for i, (k, v) in enumerate(cf.logprob_with.items())},
            logprob_without={safe_path(k, i): v for i, (k, v) in enumerate(cf.logprob_without.items())},
            acquitted=cf.acquitted,
            seconds=cf.seconds) if cf is not None else None,
        approved_by=decision.approved_by,
        tool_class=tool_class_record(decision.tool_class) if decision.tool_class is not None else None,
    )  # fmt: skip


def tool_class_record(cls: ToolClass) -> ToolClassRecord:
    """A tool's inferred class as the log records it (argument paths that are not plain
    identifiers by their position, as for arguments)."""
    routing = cls.routing[:MAX_CLASS_ITEMS]  # a schema with more is still decided in full; the log keeps the first
    return ToolClassRecord(
        effect=cls.effect, routing={safe_path(path, i): kind for i, (path, kind) in enumerate(routing)},
        content=[safe_path(path, i) for i, path in enumerate(cls.content[:MAX_CLASS_ITEMS])], basis=cls.basis,
        reasons=[r[:256] for r in cls.reasons[:32]])


def _unit(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


def approval_key(tool: str, digest: str, decision: ToolCallDecision) -> str:
    """Names a held call for a remembered approval: tool, argument digest, the rule that held
    it, the offending refs (what a ``when_in_attention`` rule matched: a new injection in
    attention is another key, asked about again) and the triggering sources of its arguments."""
    h = blake3.blake3(b"approval/2\x00" + tool.encode() + b"\x00" + digest.encode())
    h.update(b"\x00" + (decision.rule_id or "").encode())
    for ref in sorted(set(decision.offending)):
        h.update(b"\x02" + ref.encode())
    for t in sorted(decision.triggers, key=lambda t: (t.path, t.entity or "")):
        h.update(f"\x00{t.path}\x00{t.entity}\x00{t.origin}".encode())
        for s in t.sources:
            h.update(f"\x01{s.ref}\x01{s.start}\x01{s.end}".encode())
    return h.hexdigest()


def findings_out(decision: ToolCallDecision) -> list[w.ArgumentFindingOut]:
    """What a person asked to confirm is shown of why: per triggering argument, its origin and
    where its value was found (segment, ref, span, field of a structured result)."""
    return [
        w.ArgumentFindingOut(argument=t.path, entity=t.entity, origin=t.origin,
                             sources=[w.ValueSourceOut(segment=s.segment, ref=s.ref, start=s.start, end=s.end,
                                                       field=s.field, trust=s.trust, inside=s.inside)
                                      for s in t.sources[:8]])
        for t in decision.triggers
    ]


def counterfactual_out(decision: ToolCallDecision) -> w.CounterfactualOut | None:
    cf = decision.counterfactual
    if cf is None:
        return None
    return w.CounterfactualOut(refs=list(cf.refs), logprob_with=cf.logprob_with, logprob_without=cf.logprob_without,
                               acquitted=cf.acquitted, seconds=cf.seconds)
