"""A gateway session: one conversation fak forwards to an upstream model instead of running
it (docs/gateway.md). It has no KV: its ledger is the text segments of the conversation, and
what the upstream reads is the history built from the live ones (``forwarded``). Everything
else is the kernel's own:

- a tool result enters through the same admission as a kernel session's
  (``fak.kernel.session.admission``: CAS ref, the gate, lifetime, the ``AdmissionVerdict``
  event, the producer recorded); QUARANTINE or DENY forwards a notice in its place, REDACT
  the redacted form;
- a call the upstream writes is decided by the same ``decide_call`` (argument provenance over
  the live segments' texts, ``when_in_attention`` over their refs), with no attention evidence
  (rules that ask for it fire: none is acquitted) and the event naming the upstream;
- eviction (the DENY remedy) and a forget drop segments from the forwarded history, audited
  (``Eviction`` mode ``FORWARD``). For a stateless upstream this is exact by construction: the
  next request it receives does not hold the bytes, and it recomputes from the request. A
  request already sent is not recalled (as a model turn already running finishes first).

Attention provenance here is the whole live history: an upstream attends to everything it is
sent, so every live tool segment's ref is in attention of every call.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import blake3
import rfc8785

from fak.audit import Eviction
from fak.audit import ToolCallDecision as DecisionEvent
from fak.kernel.calls.authorize import CallContext, ContextEntry, Producer, ToolCallDecision, args_digest
from fak.kernel.calls.records import approval_key
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.events import AdmissionDecided, SpanEvicted, ToolCallDecided
from fak.kernel.gateway.score import UpstreamEvidence
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState, SegmentView
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.services import GatewayDrop, Services
from fak.kernel.session import admission
from fak.kernel.session.admission import Admission
from fak.kernel.session.kernel_session import decide_call
from fak.policy import VerdictKind
from fak.types import as_id

__all__ = ["GatewayDrop", "GatewaySegment", "GatewaySession", "notice"]


def notice(state: SegmentState, verdict: VerdictKind | None, rule: str | None) -> str:
    """What the upstream reads in place of a tool result it may not read (it names no ref and
    carries none of the result's bytes)."""
    if state is SegmentState.QUARANTINED:
        why = f"policy verdict {verdict.value if verdict else 'QUARANTINE'}" + (f", rule {rule}" if rule else "")
        return f"[fak] This tool result was withheld ({why})."
    if state is SegmentState.FORGOTTEN:
        return "[fak] This tool result was withdrawn (forgotten)."
    if state is SegmentState.EXPIRED:
        return "[fak] This tool result was withdrawn (its lifetime ended)."
    return "[fak] This tool result was withdrawn: a tool call it led to was denied by policy."


@dataclass
class GatewaySegment:
    """One message of a gateway session: the OpenAI message forwarded while it is live, and
    what the ledger keeps of it (ref, verdict, producer, content provenance)."""

    id: str
    kind: SegmentKind
    message: dict[str, Any]
    ref: str | None = None
    state: SegmentState = SegmentState.LIVE
    verdict: VerdictKind | None = None
    rule: str | None = None
    tool: str | None = None
    source: str | None = None
    media_type: str | None = None
    content: frozenset[str] = frozenset()  # refs whose bytes the message may carry
    attention: frozenset[str] = frozenset()  # refs live before it (what the upstream read with it)
    in_history: bool = True  # False: content sent beside the messages (the tools block), not as one
    match_text: str = ""  # the message as the chat door's history matching reads it (``history``)

    @property
    def live(self) -> bool:
        return self.state is SegmentState.LIVE

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""

    def derived_from(self, ref: str) -> bool:
        return self.ref == ref or ref in self.content

    def view(self) -> SegmentView:
        return SegmentView(id=self.id, kind=self.kind, ref=self.ref, start=None, length=0, state=self.state,
                           verdict=self.verdict, rule=self.rule, provenance=tuple(sorted(self.attention)),
                           content_provenance=tuple(sorted(self.content)), protected=False, expires_turn=None)


@dataclass(frozen=True)
class Evicted:
    """What ``GatewaySession.evict_refs`` removed from the forwarded history."""

    segment_ids: list[str]
    fingerprint: str
    audit_indexes: list[int]


@dataclass
class GatewaySession:
    """One conversation forwarded to ``upstream``; thread-safe (one lock). Build it with
    ``GatewaySessions.open`` so a forget finds it while it lives."""

    services: Services
    tenant: str
    upstream: str
    id: str = field(default_factory=lambda: "gw_" + uuid.uuid4().hex[:24])
    created_us: int = field(default_factory=lambda: time.time_ns() // 1000)
    persistent: bool = False  # kept in the durable ledger between requests (``fak_session``)
    next_number: int = 1
    segments: list[GatewaySegment] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def _new_id(self) -> str:
        sid, self.next_number = f"seg_{self.next_number}", self.next_number + 1
        return sid

    @property
    def tokenizer(self) -> ChatTokenizer:
        """fak's own tokenizer: the history matching reads a returned turn's visible text with it."""
        return self.services.tokenizer

    def history(self) -> list[tuple[SegmentView, str | None]]:
        """Each segment's view with the text a resent request's message is matched against (None
        once it left the forwarded history): ``fak.kernel.openai.history.new_suffix``."""
        with self._lock:
            return [(x.view(), x.match_text if x.live else None) for x in self.segments]

    def _live_refs(self) -> frozenset[str]:
        return frozenset(x.ref for x in self.segments if x.live and x.kind is SegmentKind.TOOL and x.ref)

    # --- building the conversation ---------------------------------------------------
    def append(self, kind: SegmentKind, message: dict[str, Any], text: str | None = None) -> GatewaySegment:
        """A system, user or assistant message as the client sent it (or the upstream's answer);
        ``text``: what a resent copy of it is matched against (default: its content). An
        assistant message gets the content provenance of every ref live now (it may repeat what
        they said), as a generated turn does in a kernel session."""
        with self._lock:
            live = self._live_refs()
            content = frozenset().union(live, *(x.content for x in self.segments if x.live)) \
                if kind is SegmentKind.ASSISTANT else frozenset()
            match = text if text is not None else (message.get("content") if isinstance(message.get("content"), str)
                                                   else "")
            seg = GatewaySegment(self._new_id(), kind, message, content=content, attention=live, match_text=match or "")
            self.segments.append(seg)
            return seg

    def admit(self, tool: str, data: bytes, *, call_id: str | None, name: str | None = None,
              media_type: str = "text/plain", source: str | None = None, in_history: bool = True) -> Admission:
        """A tool result through the gate, as ``KernelSession.admit`` (the same admission, event
        and records); the forwarded history carries the admitted text (REDACT: the redacted
        form) or, for a result kept out, a notice. ``call_id`` / ``name``: the message it answers
        (a tool message's id, a legacy function message's name). ``in_history`` False: content
        the upstream is sent beside the messages (the tools block), in attention all the same."""
        result = admission.tool_result(tool, data, media_type, (), source)
        services = self.services
        with self._lock:
            decided = admission.decide(services, self.tenant, self.id, result)
            seg_id = self._new_id()
            event = decided.event(self.tenant, self.id, seg_id)
            verdict = decided.verdict
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id} if call_id is not None \
                else {"role": "function", "name": name or tool}
            if decided.admitted_ref is not None:
                message["content"] = decided.body.decode("utf-8", errors="replace")
                seg = GatewaySegment(seg_id, SegmentKind.TOOL, message, ref=decided.admitted_ref,
                                     verdict=verdict.kind, rule=verdict.rule_id, tool=result.tool, source=result.source,
                                     media_type=result.base_media_type, content=frozenset({decided.admitted_ref}),
                                     attention=self._live_refs() | {decided.admitted_ref})
            else:
                message["content"] = notice(SegmentState.QUARANTINED, verdict.kind, verdict.rule_id)
                seg = GatewaySegment(seg_id, SegmentKind.TOOL, message, ref=decided.ref,
                                     state=SegmentState.QUARANTINED, verdict=verdict.kind, rule=verdict.rule_id,
                                     tool=result.tool, source=result.source)
            seg.in_history = in_history
            index = services.audit.append(event)  # logged before the segment is used
            self.segments.append(seg)
        admission.record(services, self.tenant, self.id, decided, seg.id, kv_unit=False)  # no KV holds it
        services.events.publish(AdmissionDecided(self.tenant, verdict.kind))
        admission.late_check(services, self.tenant, self.id, decided)
        return Admission(verdict, decided.ref, decided.admitted_ref, _as_segment(seg), index)

    # --- what the upstream reads ----------------------------------------------------------
    def forwarded(self, without: Collection[str] = ()) -> list[dict[str, Any]]:
        """The history the upstream is sent: every live message; a tool result kept out or
        withdrawn as a notice (the call it answers stays answered); an assistant message a
        remedy evicted left out, with the tool results that answer its calls. ``without``: as
        it would be once ``evict_refs(without)`` ran (a counterfactual; nothing changes)."""
        gone = frozenset(without)
        with self._lock:
            out: list[dict[str, Any]] = []
            answered: set[str] = set()  # call ids of the assistant messages sent
            for seg in self.segments:
                if not seg.in_history:
                    continue
                state = seg.state
                if gone and seg.live and ((seg.kind is SegmentKind.TOOL and seg.ref in gone)
                                          or (seg.kind is SegmentKind.ASSISTANT and seg.content & gone)):
                    state = SegmentState.EVICTED
                if seg.kind is SegmentKind.ASSISTANT:
                    if state is SegmentState.LIVE:
                        out.append(seg.message)
                        answered |= {c["id"] for c in seg.message.get("tool_calls") or []
                                     if isinstance(c, dict) and isinstance(c.get("id"), str)}
                    continue
                if seg.kind is not SegmentKind.TOOL:
                    if state is SegmentState.LIVE:
                        out.append(seg.message)
                    continue
                call_id = seg.message.get("tool_call_id")
                if call_id is not None and call_id not in answered:
                    continue  # its call was evicted with the turn that wrote it
                out.append(seg.message if state is SegmentState.LIVE
                           else {**seg.message, "content": notice(state, seg.verdict, seg.rule)})
            return out

    def fingerprint(self) -> str:
        """A digest of the forwarded history (canonical JSON): what the upstream would be sent
        now. Equal histories, equal fingerprints (the audit log keys it per tenant)."""
        return _digest(self.forwarded())

    def provenance(self) -> frozenset[str]:
        """The refs whose bytes an answer to the forwarded history may carry."""
        with self._lock:
            return frozenset().union(self._live_refs(), *(x.content for x in self.segments if x.live))

    def views(self) -> list[SegmentView]:
        with self._lock:
            return [x.view() for x in self.segments]

    # --- tool-call decisions ------------------------------------------------------------
    def context(self) -> CallContext:
        """What a decision reads: every live tool segment's ref with its producer, and the texts
        of the live system, user and tool segments."""
        with self._lock:
            producers: dict[str, list[Producer]] = {}
            entries: list[ContextEntry] = []
            for seg in self.segments:
                if not seg.live:
                    continue
                if seg.kind is SegmentKind.TOOL and seg.ref:
                    producer: Producer = (seg.tool or "?", seg.source)
                    producers.setdefault(seg.ref, []).append(producer)
                    entries.append(ContextEntry(seg.id, seg.ref, seg.text, producer, seg.media_type))
                elif seg.kind in (SegmentKind.SYSTEM, SegmentKind.USER):
                    entries.append(ContextEntry(seg.id, None, seg.text))
            return CallContext({r: tuple(dict.fromkeys(p)) for r, p in producers.items()}, tuple(entries), self.tenant)

    def decide(self, name: str, args: Any, principal: str | None, spec: ToolSpec | None = None) -> ToolCallDecision:
        """The verdict on a call the upstream wrote, logged before it acts; ``spec``: the tool as
        the request declared it (its schema classifies a tool no rule names)."""
        decision, event = self.decide_unlogged(name, args, principal, spec)
        index = self.services.audit.append(event)
        self.services.events.publish(ToolCallDecided(self.tenant, decision.verdict))
        return _with_index(decision, index)

    def decide_unlogged(self, name: str, args: Any, principal: str | None, spec: ToolSpec | None = None
                        ) -> tuple[ToolCallDecision, DecisionEvent]:
        up = self.services.upstreams.find(self.upstream)
        evidence = UpstreamEvidence(self.services.upstreams, up, self, name, args) if up and up.scores else None
        return decide_call(self.services, self.tenant, self.id, self.created_us, name, args, self.context(),
                           principal, evidence, upstream=self.upstream, spec=spec)

    def approval_key(self, name: str, args: Any, decision: ToolCallDecision) -> str:
        return approval_key(name, args_digest(self.services.keys.tool_args_key(), args), decision)

    # --- taking segments out ----------------------------------------------------------------
    def evict_refs(self, refs: Collection[str], *, reason: str = "tool_call_denied") -> Evicted:
        """The DENY remedy: the live tool segments of ``refs`` and the assistant messages that may
        carry what they caused leave the forwarded history (one ``Eviction`` event each, mode
        ``FORWARD``); the upstream is then asked again with a history that never held them."""
        wanted = frozenset(refs)
        with self._lock:
            victims = [x for x in self.segments if x.live and (
                (x.kind is SegmentKind.TOOL and x.ref in wanted)
                or (x.kind is SegmentKind.ASSISTANT and x.content & wanted))]
            if not victims:
                return Evicted([], self.fingerprint(), [])
            # the history after, and every event validated, before anything changes; the segments
            # leave only once each event is logged (a failed append leaves the session as it was)
            after = _digest(self.forwarded(without=wanted))
            fp = self.services.keys.audit_fingerprint(self.tenant, after)
            events = [Eviction(tenant=self.tenant, session_id=self.id, segment_id=x.id, ref=x.ref, mode="FORWARD",
                               exact=True, tokens=0, reason=as_id(reason), fingerprint_after=fp) for x in victims]
            indexes = [self.services.audit.append(ev) for ev in events]
            for x in victims:
                x.state = SegmentState.EVICTED
        self.services.events.publish(SpanEvicted(self.tenant, "forward"))
        return Evicted([x.id for x in victims], after, indexes)

    def drop(self, refs: Collection[str], state: SegmentState) -> GatewayDrop | None:
        """A withdrawal's drop (forget, quarantine, expiry): every live segment derived from
        ``refs`` leaves the forwarded history, marked ``state``; None when none was live."""
        with self._lock:
            victims = [x for x in self.segments if x.live and any(x.derived_from(r) for r in refs)]
            for x in victims:
                x.state = state
            return GatewayDrop(self.id, [x.id for x in victims], self.fingerprint()) if victims else None

    def holds_live(self, ref: str) -> bool:
        """Whether a live segment carries ``ref`` (the tools block of an earlier request)."""
        with self._lock:
            return any(x.live and x.ref == ref for x in self.segments)


def _digest(history: list[dict[str, Any]]) -> str:
    return "fwd:" + blake3.blake3(rfc8785.dumps(history)).hexdigest()


def _with_index(decision: ToolCallDecision, index: int) -> ToolCallDecision:
    return replace(decision, audit_index=index)


def _as_segment(seg: GatewaySegment) -> Segment:
    """The ledger ``Segment`` form an ``Admission`` carries (id, state, ref; no tokens)."""
    return Segment(id=seg.id, kind=seg.kind, tokens=[], chunks=[], ref=seg.ref, state=seg.state,
                   verdict=seg.verdict, rule=seg.rule, content=seg.content, tool=seg.tool, source=seg.source,
                   media_type=seg.media_type)

