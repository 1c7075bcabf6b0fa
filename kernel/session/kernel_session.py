"""A kernel session: one conversation's KV (``fak.kernel.kv.session.Session``), its
lock, and the audited operations on it. Below it, each a module with one job: the durable
ledger's rows and rebuild (``fak.kernel.session.durable_ledger``), how its ``Session`` is built
(``fak.kernel.session.options``), the policy's half of an admission (``fak.kernel.session.admission``).

Every operation is all or nothing: each change runs in one ``transaction()``
(``fak.kernel.session.transaction``), which validates the audit event before anything changes,
changes the in-memory session, appends the event, and only then writes the ledger to
the database. If the append or the write fails, the in-memory session is discarded and
rebuilt from the durable ledger on next use (bit-exact: replay makes the same prefill
calls), so no failure leaves a half-applied change behind. A generated turn is kept only
when its iterator is exhausted; a consumer that stops early leaves cache and ledger as
they were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from fak.audit import Eviction, SessionRebuilt
from fak.audit import ToolCallDecision as DecisionEvent
from fak.errors import Conflict, Forbidden, InvalidInput
from fak.kernel.calls.authorize import (
    AttentionView,
    CallContext,
    EvidenceSource,
    ToolCallDecision,
    args_digest,
    parsed_args,
)
from fak.kernel.calls.generated import GeneratedCall, TurnEvidence
from fak.kernel.calls.records import approval_key, decision_event
from fak.kernel.calls.tool_classes import spec_of
from fak.kernel.calls.tool_text import ToolSpec
from fak.kernel.events import AdmissionDecided, SpanEvicted, TokensDecoded, ToolCallDecided
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState, SegmentView
from fak.kernel.kv.session import EvictionReport, EvictMode, Session
from fak.kernel.model.generate import SamplingParams
from fak.kernel.model.scheduler import tenant_scope
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.services import DerivedEviction, Services, SessionBusy
from fak.kernel.session import admission
from fak.kernel.session.admission import MAX_SOURCE, QUARANTINED_RULE, Admission, RefBeingForgotten
from fak.kernel.session.durable_ledger import CommittedSession, DurableLedger
from fak.kernel.session.materialise import MaterialiseResult, WorkingSet, materialise
from fak.kernel.session.options import new_session, pic_binding, replayed, session_options
from fak.kernel.session.transaction import Transaction, TransactionError
from fak.kernel.withdrawal.quarantine import evict_in_place, expire, expire_due
from fak.state.store import ForgetProgress
from fak.types import as_id

__all__ = ["GENERATION_OVERHEAD", "MAX_SOURCE", "MAX_TEXT_BYTES", "QUARANTINED_RULE", "Admission", "ContextFull",
           "CallDecider", "KernelSession", "RefBeingForgotten", "RefsEvicted", "SessionBusy", "TurnReceipt",
           "decide_call"]

MAX_TEXT_BYTES = 1 << 20
GENERATION_OVERHEAD = 16  # tokens an answer needs besides its own: the turn's opener and closing


class ContextFull(Conflict):
    """The session's context would pass the model's (or the configured) length."""

    code = "context_full"


@dataclass(frozen=True)
class RefsEvicted:
    """What ``evict_refs`` removed: segment ids, the exactness word, the fingerprint after,
    and the audit index of each segment's ``Eviction`` event."""

    segment_ids: list[str]
    exactness: str
    fingerprint: str
    audit_indexes: list[int]


@dataclass
class TurnReceipt:
    """What a kept turn's commit computed, for its caller (``generate(receipt=...)``): the KV
    fingerprint the ledger was written with, so an answer that reports it does not hash the
    whole KV again. None until the turn is kept."""

    fingerprint: str | None = None


class CallDecider:
    """Decides the tool calls one generated turn writes, as ``authorize_tool_call`` does (the
    same decision, the same audit event), against the attention the turn was generated with.
    ``decide`` logs each decision without waiting for the log's commit, so a door can decide the
    calls as soon as the model's last token is drawn and let the commit run while the turn
    closes (its closing tokens' forward); the turn waits for every commit before it is kept
    (a decision the log cannot commit rolls the turn back), and ``settle`` returns the
    decisions with their audit indexes: call it before anything is answered (the decisions
    are logged before they act: write-ahead)."""

    def __init__(self, ks: KernelSession, principal: str | None, tools: Sequence[ToolSpec] = ()) -> None:
        self._ks = ks
        self._tools = {t.name: t for t in tools}  # the request's tools: their schemas classify them
        self._context: CallContext | None = None
        self._session: Session | None = None
        self._base = 0
        self._principal = principal
        self._pending: list[tuple[ToolCallDecision, Future[int]]] = []
        self._settled: list[ToolCallDecision] = []

    @property
    def refs(self) -> tuple[str, ...]:
        """The refs in attention of the bound turn: what a call it writes may derive from (a
        held call's arguments are sealed under their data keys)."""
        return tuple(self._context.producers) if self._context is not None else ()

    def bind(self, context: CallContext, session: Session | None = None, base: int = 0) -> None:
        """The context of the turn, read by ``KernelSession.generate`` under the session's lock
        when the turn starts (no other operation can change it until the turn ends); with the
        session and the turn's first row, the model's evidence can be computed for a call."""
        self._context, self._session, self._base = context, session, base

    def decide(self, name: str, args: Any = None, turn: Callable[[], GeneratedCall | None] | None = None
              ) -> ToolCallDecision:
        """The decision on one call (its audit index once settled); logged, not waited for.
        ``turn``: locates the call among the turn's tokens, for rules that ask for the model's
        evidence; call ``decide`` with it only while the turn is open (it holds the lock)."""
        if self._context is None:
            raise TransactionError("a call decider is bound by the generation it decides for (generate(decider=...))")
        evidence = TurnEvidence(self._session, self._base, turn) if turn is not None and self._session else None
        spec = self._tools.get(name)  # an MCP tool is decided under its governed name (mcp:<label>/<tool>)
        decision, event = self._ks.decide_call(spec.decided_as if spec is not None else name, args, self._context,
                                               self._principal, evidence, spec)
        self._pending.append((decision, self._ks.services.audit.submit(event)))
        self._ks.services.events.publish(ToolCallDecided(self._ks.tenant, decision.verdict))
        return decision

    def settle(self) -> list[ToolCallDecision]:
        """Every decision made so far, in order, once the log holds it (its audit index);
        raises what the log raised for one it could not commit. ``generate`` settles before it
        keeps the turn, so a turn whose decisions are not logged is rolled back."""
        self._settled += [replace(d, audit_index=f.result()) for d, f in self._pending]
        self._pending = []
        return list(self._settled)


def remember_approval(services: Services, tenant: str, session_id: str, key: str, approval_index: int,
                      call_id: str = "") -> bool:
    """Remember a person's approval for session ``session_id`` wherever it runs (the state
    database; no need to load it), if the active policy remembers approvals and the session
    still exists: whether it was kept."""
    if not services.policy.spec.tool_calls.remember_approvals:
        return False
    created = services.state.session_created(tenant, session_id)
    if created is None:
        return False
    return services.holds.remember(tenant, session_id, created, key, call_id, approval_index)


def decide_call(services: Services, tenant: str, session_id: str, created_us: int, name: str, args: Any,
                context: CallContext, principal: str | None, evidence: EvidenceSource | None = None,
                upstream: str | None = None, spec: ToolSpec | None = None) -> tuple[ToolCallDecision, DecisionEvent]:
    """The decision on a call in ``context`` and its audit event, not logged: what
    ``KernelSession.decide_call`` and a gateway session (``fak.kernel.gateway``, ``upstream``: the
    model that wrote the call, whose attention fak cannot see) both decide with. A CONFIRM a person
    already approved in this session for the same call under the same rule, offending refs and
    argument sources is allowed, naming the approval."""
    if not isinstance(name, str) or not name or len(name) > 128:
        raise InvalidInput("a tool name is a non-empty string of at most 128 characters")
    args = parsed_args(args)  # once, for the digest and the decision
    digest = args_digest(services.keys.tool_args_key(), args)
    decision = services.authorizers.current(services.policy).decide(name, context, args, evidence, spec)
    if decision.verdict == "CONFIRM" and services.policy.spec.tool_calls.remember_approvals:
        approved = services.holds.approved(tenant, session_id, created_us, approval_key(name, digest, decision))
        if approved is not None:
            decision = replace(decision, verdict="ALLOW", approved_by=approved)
    event = decision_event(tenant, session_id, name, digest, decision, principal)
    if upstream is not None:
        event = event.model_copy(update={"upstream": as_id(upstream)})
    return decision, event


MAX_DECLARED_TOOLS = 1024  # an agent's toolset; each kept in the session's memory


def _turns(s: Session) -> int:
    """Model turns the session has had: assistant segments in its ledger, whatever their state."""
    return sum(1 for x in s.ledger.segments if x.kind is SegmentKind.ASSISTANT)


class KernelSession:
    """Get one from ``Kernel.session(tenant, id)``; thread-safe (one lock per session)."""

    def __init__(self, services: Services, tenant: str, session_id: str, created_us: int, *, fresh: bool) -> None:
        self.services = services
        self.tenant = tenant
        self.id = session_id
        self.created_us = created_us
        self._lock = threading.Lock()
        self._mech: Session | None = None
        # live segments the load for a forget left out unread (``DurableLedger.load``): that
        # forget's eviction reports them; a session loaded so lives only under that lock
        self._left_out: list[Segment] = []
        self._cause = "restart"  # why the next rebuild happens (for the SessionRebuilt event)
        self._ledger = DurableLedger(services, tenant, session_id, created_us)
        self._in_attention = AttentionView(services.producers, tenant)
        self._tools: dict[str, ToolSpec] = {}  # declared by the agent (declare_tools)
        self.last_used = time.monotonic()
        if fresh:
            self._mech = new_session(services, tenant, session_id)
            self._persist()

    # --- locking and loading --------------------------------------------------
    @contextmanager
    def _locked(self, wait: bool = True, dropping: Collection[str] = ()) -> Iterator[Session]:
        self._acquire(wait)
        try:
            with tenant_scope(self.tenant):  # the engine's fairness and figures are per tenant
                s = self._loaded(dropping)
                if not self._left_out:
                    # a forget's load (segments left out unread) is settled by nothing but that
                    # forget's eviction: a quarantine or expiry committed here would write the
                    # ledger without them under its own entry before the forget logs them
                    self._settle(s)
                s = self._loaded()
                s.pic = pic_binding(self.services, self.tenant)  # the active policy decides, also after a reload
                yield s
        finally:
            self._release()

    def _acquire(self, wait: bool = True) -> None:
        got = self._lock.acquire(timeout=self.services.settings.lock_timeout_s) if wait else self._lock.acquire(False)
        if not got:
            raise SessionBusy(f"session {self.id} is busy (a generation or another operation holds it)")
        self.last_used = time.monotonic()

    def _settle(self, s: Session) -> None:
        """Apply, before anything else, what was decided while the session was busy: a
        quarantine or expiry still pending here, and refs whose lifetime in turns has ended."""
        pending = self.services.withdrawals.pending(self.tenant)
        live = s.ledger.live()
        if pending:
            # its own segments of a pending ref, or rows that attended to one (PIC chunks)
            due = {r: state for r, state in pending.items() if any(x.ref == r or r in x.provenance for x in live)}
            if due:
                evict_in_place(self.services, self, s, due)
                live = s.ledger.live()
        expiring = [x for x in live if x.expires_turn is not None]
        if expiring:
            turns = _turns(s)
            for ref in dict.fromkeys(x.ref for x in expiring
                                     if x.expires_turn is not None and turns >= x.expires_turn and x.ref):
                expire(self.services, self.tenant, ref, cause="turns", held=self)

    def _before_use(self) -> None:
        """Execute expiries whose time has come before attention is used (outside any lock)."""
        if self.services.withdrawals.expiry_due():
            expire_due(self.services, tenant=self.tenant)

    def _release(self) -> None:
        if self._left_out:  # a forget's load its eviction did not commit: not a state to serve
            self._mech, self._left_out = None, []
        self.last_used = time.monotonic()
        self._lock.release()
        self.services.sessions.enforce_kv_budget(keep=self)

    def _loaded(self, dropping: Collection[str] = ()) -> Session:
        if self._mech is None:
            self._mech = self._rebuild(dropping)
        return self._mech

    def offload(self) -> bool:
        """Drop this session's KV (ledger kept) if nobody is using it; True if dropped."""
        if self._mech is None or not self._lock.acquire(blocking=False):
            return False
        try:
            self._mech = None
            self._cause = "offload"
            return True
        finally:
            self._lock.release()

    @property
    def loaded(self) -> bool:
        return self._mech is not None

    # --- transactions -----------------------------------------------------------
    @contextmanager
    def transaction(self, wait: bool = True, dropping: Collection[str] = ()) -> Iterator[Transaction]:
        """One audited change: the lock taken, the session loaded, pending withdrawals settled;
        a failure once ``tx.change()`` was called rolls back (``fak.kernel.session.transaction``).
        ``dropping``: the refs a forget erases; an offloaded session is rebuilt without reading
        what derives from them (their bytes may be erased already), for ``evict_derived``."""
        with self._locked(wait, dropping), Transaction(self, self.services.audit.append) as tx:
            yield tx

    def held_transaction(self) -> Transaction:
        """A transaction for a caller that already holds the lock (a settle, a withdrawal)."""
        return Transaction(self, self.services.audit.append)

    # --- for the withdrawal paths (fak.kernel.withdrawal.forget, fak.kernel.withdrawal.quarantine) and the façade ------
    def locked(self, wait: bool = True) -> AbstractContextManager[Session]:
        """The session under its lock, loaded and with pending withdrawals settled (a change
        goes through ``transaction``)."""
        return self._locked(wait)

    @contextmanager
    def held(self, wait: bool = True) -> Iterator[None]:
        """The lock alone, nothing loaded: what a delete holds while it removes the session
        (its KV is not needed, and a ledger that cannot be replayed, one holding a ref erased
        since a restored backup, is deleted too)."""
        self._acquire(wait)
        try:
            yield
        finally:
            self._release()

    def acquire(self, wait: bool = True) -> None:
        """Take the lock without settling (a withdrawal applies its own ref); ``release()`` after."""
        self._acquire(wait)

    def release(self) -> None:
        """Give back the lock ``acquire`` took (and let the KV budget offload idle sessions)."""
        self._release()

    @property
    def live_session(self) -> Session | None:
        """The in-memory session, None if offloaded (no rebuild); read without the lock it is a
        snapshot, enough to plan a withdrawal or read a counter."""
        return self._mech

    def loaded_session(self) -> Session:
        """The in-memory session, rebuilt from the durable ledger if offloaded (hold the lock)."""
        return self._loaded()

    def loaded_if_idle(self) -> Session | None:
        """The loaded session if nobody holds the lock (taken only to load it), else None."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            return self._loaded()
        finally:
            self._lock.release()

    def persist(self, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None:
        """Write the ledger (``forget``: the forget's progress row in the same transaction);
        called by a ``Transaction``'s commit."""
        self._persist(forget, fingerprint)

    def discard(self) -> None:
        """Drop the in-memory session after a failed change; the durable ledger rebuilds it.
        The rollback primitive: only ``fak.kernel.session.transaction`` calls it."""
        self._mech, self._left_out = None, []
        self._cause = "rollback"

    def unload(self) -> None:
        """Drop the in-memory session of a deleted session (its lock is held)."""
        self._mech = None

    def replace_with_replay(self, s: Session) -> Session:
        """Swap ``s`` for an exact replay of its ledger (rows attended to a withdrawn ref)."""
        self._mech = replayed(self.services, self.tenant, self.id, s)
        return self._mech

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The model's tokenizer (adapters decode generated ids with it)."""
        return self.services.tokenizer

    @property
    def kv_bytes(self) -> int:
        mech = self._mech
        return mech.cache.nbytes_allocated if mech is not None else 0

    def _check_room(self, s: Session, what: str) -> None:
        """Raise ContextFull when the session holds more tokens than the context allows (the
        caller discards the in-memory change: nothing of it stays)."""
        limit = self.services.context_limit
        if s.cache.length > limit:
            raise ContextFull(f"{what} would make the session {s.cache.length} tokens long; "
                              f"the context holds {limit}")

    # --- durable ledger (``fak.kernel.session.durable_ledger``) ------------------------
    def _persist(self, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None:
        """Write the ledger of the loaded session; ``fingerprint``: the KV's, when the caller has
        just computed it (hashing the whole KV again is the costliest part of a write)."""
        self._ledger.write(self._loaded(), forget, fingerprint)

    def _rebuild(self, dropping: Collection[str] = ()) -> Session:
        """The session replayed from the durable ledger (checked against its fingerprint), and
        logged (``SessionRebuilt``) with why it was rebuilt. ``dropping``: a forget's refs,
        left out unread (the forget's commit records and logs the state it leaves)."""
        loaded = self._ledger.load(session_options(self.services, self.tenant, self.id), dropping)
        s = loaded.session
        if loaded.left_out:
            self._left_out = list(loaded.left_out)
            return s
        if loaded.replaces_record:
            # recorded under another model or weight format (FAK_WEIGHTS changed: the same ledger
            # computes other bytes here), or with approximate KV (REROPE, PIC) no replay
            # reproduces: the exact replay becomes the state, is recorded, and says why
            if loaded.model_changed and self._cause != "rollback":
                self._cause = "model_changed"
            self._mech = s
            self._persist(fingerprint=loaded.fingerprint)
        if self._cause != "rollback":  # a rollback restores the last logged state: nothing new to record
            self.services.audit.append(SessionRebuilt(
                tenant=self.tenant, session_id=self.id, segments=len(s.ledger.live()), tokens=s.cache.length,
                fingerprint=self.services.keys.audit_fingerprint(self.tenant, loaded.fingerprint),
                cause=self._cause))
        self._cause = "restart"
        return s

    # --- reading --------------------------------------------------------------
    def committed(self) -> CommittedSession:
        """The session as its last audited change committed it, read from the durable ledger:
        what the REST API, the SDK and the console show. It takes no lock (a running turn is not
        waited for), never rebuilds an offloaded KV and writes nothing to the audit log, so a
        reader cannot slow an agent down; the reads below are the kernel's own, on the KV."""
        return self._ledger.committed()

    def segments(self) -> list[SegmentView]:
        """The ledger as others may see it, typed: ids, digests, verdicts, provenance."""
        with self._locked() as s:
            return [seg.view() for seg in s.ledger.segments]

    def history(self) -> list[tuple[SegmentView, str | None]]:
        """Each segment's view with the text of its chat message: for a live segment, what was
        appended, admitted (a REDACT: the redacted text) or generated; None once it left the KV
        (evicted, quarantined, forgotten: no content kept). What a resent conversation is
        matched against (``fak.kernel.openai.history``)."""
        with self._locked() as s:
            return [(seg.view(), m["content"] if (m := s.message(seg.id)) is not None else None)
                    for seg in s.ledger.segments]

    def ledger(self) -> list[dict[str, object]]:
        """``segments()`` as JSON-ready dicts (the API's and the audit's form)."""
        return [v.as_dict() for v in self.segments()]

    def fingerprint(self) -> str:
        with self._locked() as s:
            return s.fingerprint()

    def replay_fingerprint(self) -> str:
        """Fingerprint of an independent replay of the live ledger in a fresh session."""
        with self._locked() as s:
            return s.replay_fingerprint()

    @property
    def prefix_hit_tokens(self) -> int:
        """Tokens this session was served from the prefix cache so far (since it was loaded)."""
        with self._locked() as s:
            return s.prefix_hit_tokens

    @property
    def tokens(self) -> int:
        with self._locked() as s:
            return s.cache.length

    @property
    def exact_rows(self) -> int:
        """How many leading KV rows are the bytes an exact run of the live calls computes: all of
        them unless PIC served rows (or REROPE moved them), which are approximate."""
        with self._locked() as s:
            return s.exact_rows

    def refs(self) -> set[str]:
        """Every ref in the attention provenance of the live KV."""
        with self._locked() as s:
            return s.refs()

    # --- appending text -------------------------------------------------------
    def append(self, kind: SegmentKind | str, text: str, *, tools: list[dict[str, Any]] | None = None) -> Segment:
        """Append a system, user or assistant message (tool results go through ``admit``).
        An assistant message given as text (a client resending a history, another model's
        turn) gets the content provenance of every ref live now, as a generated turn would.
        ``tools``: the request's tools, known when the message is rendered (a template whose
        turn markup depends on them, Llama 3's system header; ``ChatTokenizer.encode_message``);
        the segment keeps that form."""
        try:
            kind = SegmentKind(kind)
        except ValueError:
            raise InvalidInput(f"kind must be system, user or assistant, not {kind!r}") from None
        if kind is SegmentKind.TOOL:
            raise InvalidInput("a tool result goes through admit (the policy gate), not append")
        if not isinstance(text, str):
            raise InvalidInput("text must be a string")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput("text is not valid Unicode (it holds a lone surrogate)") from None
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise InvalidInput(f"text is larger than {MAX_TEXT_BYTES} bytes")
        self._before_use()
        with self.transaction() as tx:
            s = tx.change()
            content: frozenset[str] = frozenset()
            if kind is SegmentKind.ASSISTANT:
                content = frozenset().union(*(x.provenance | x.content for x in s.ledger.live()))
            if tools and s.tokenizer is not None:
                message = {"role": kind.value, "content": text}
                ids = s.tokenizer.encode_message(s.live_messages(), message, tools)
                seg = s.append(kind, tokens=ids, message=message, content=content)
            else:
                seg = s.append(kind, text, content=content)
            self._check_room(s, f"this {kind.value} message")
            tx.commit()
            return seg

    # --- tool results ---------------------------------------------------------
    def admit(
        self, tool: str, data: bytes, *, media_type: str = "text/plain", tags: Sequence[str] = (),
        source: str | None = None, role: str | None = None,
    ) -> Admission:
        """A tool result's path into attention: CAS put → gate → verdict → audit event
        (the policy's half: ``fak.kernel.session.admission``).

        ``ALLOW``: appended as a tool segment carrying the ref. ``REDACT``: the redacted
        bytes are stored as their own ref and appended. ``QUARANTINE``/``DENY``: recorded in
        the ledger, never prefilled (== never saw it). In audit-only policy mode the bytes
        are admitted and the event records what the policy would have done. ``source``: the URL
        the result came from (rules, exceptions and trust may depend on its host). ``role``: the
        chat role the admitted text is rendered as, when not ``tool`` (the door's tools block,
        shown as the model's template shows tools: a system turn)."""
        result = admission.tool_result(tool, data, media_type, tags, source)
        self._before_use()
        with self.transaction() as tx:
            s = tx.session
            decided = admission.decide(self.services, self.tenant, self.id, result)
            segment_id = s.ledger.new_id()
            event = decided.event(self.tenant, self.id, segment_id)  # validated before anything changes
            verdict, digest = decided.verdict, decided.policy.digest
            tx.change()
            if decided.admitted:
                segment = s.append(SegmentKind.TOOL, decided.body.decode("utf-8", errors="replace"),
                                   ref=decided.admitted_ref, verdict=verdict.kind.value, rule=verdict.rule_id,
                                   policy_digest=digest, segment_id=segment_id, role=role)
                segment.expires_turn = _turns(s) + decided.turns if decided.turns is not None else None
                segment.tool, segment.source, segment.media_type = result.tool, result.source, result.base_media_type
                self._check_room(s, "this tool result")
            else:
                segment = s.record_quarantined(SegmentKind.TOOL, ref=decided.ref, verdict=verdict.kind.value,
                                               rule=verdict.rule_id, policy_digest=digest, segment_id=segment_id)
            index = tx.audit(event)
            admission.record(self.services, self.tenant, self.id, decided, segment.id)
            tx.commit()
            self.services.events.publish(AdmissionDecided(self.tenant, verdict.kind))
            admission.late_check(self.services, self.tenant, self.id, decided)
            return Admission(verdict, decided.ref, decided.admitted_ref, segment, index)

    # --- eviction -------------------------------------------------------------
    def evict(self, segment_id: str, mode: EvictMode | str | None = None, *, reason: str = "manual") -> EvictionReport:
        """Evict a live segment; ``mode`` defaults to the policy's (RECOMPUTE or REROPE;
        write-time when the segment is the tail)."""
        with self.transaction() as tx:
            seg = tx.session.ledger.get(segment_id)
            mode = EvictMode(mode) if mode is not None else self.services.evict_mode()
            if mode is EvictMode.REROPE and self.services.policy.spec.eviction.mode != "rerope":
                raise Forbidden("REROPE is approximate: the active policy allows exact eviction only "
                                "(spec.eviction.mode: recompute)")
            probe = dict(tenant=self.tenant, session_id=self.id, segment_id=seg.id, ref=seg.ref,
                         mode="RECOMPUTE", exact=True, tokens=seg.length, reason=as_id(reason))
            Eviction(**probe)  # a bad reason or id fails here, before the cache changes
            report = tx.change().evict([segment_id], mode)
            tx.audit(Eviction(**probe | dict(
                mode="TRUNCATE" if report.mode is EvictMode.WRITE_TIME else report.mode.name,
                exact=report.exactness == "bit-exact",
                fingerprint_after=self.services.keys.audit_fingerprint(self.tenant, report.fingerprint))))
            tx.commit(fingerprint=report.fingerprint)
            self.services.events.publish(SpanEvicted(self.tenant, report.mode.value))
            return report

    # --- tool-call authorization ---------------------------------------------------
    def declare_tools(self, tools: Sequence[Mapping[str, Any] | ToolSpec]) -> None:
        """The tools the agent may call (OpenAI tool definitions, bare functions, MCP tools):
        with the policy's ``from_schemas``, a tool no rule names is classified from its schema
        (``fak.kernel.calls.tool_classes``). Replaces what was declared before; kept in this
        process's memory of the session (declare them again after a restart)."""
        if len(tools) > MAX_DECLARED_TOOLS:
            raise InvalidInput(f"{len(tools)} tools declared: at most {MAX_DECLARED_TOOLS}")
        specs = [t if isinstance(t, ToolSpec) else spec_of(t) for t in tools]
        self._tools = {t.name: t for t in specs}

    def authorize_tool_call(self, name: str, args: Any = None, *, principal: str | None = None,
                            tool: Mapping[str, Any] | ToolSpec | None = None) -> ToolCallDecision:
        """May the agent call tool ``name`` now? ``ALLOW | CONFIRM | DENY`` from the policy's
        ``tool_calls`` rules over the refs in the attention provenance of the live context,
        with the offending refs and the rule; logged (the arguments as a keyed digest only).
        Whoever generated the call: this session's model, or a framework's model reporting it.
        ``tool``: the tool's definition for this call (else the one declared, if any)."""
        spec = (tool if isinstance(tool, ToolSpec) else spec_of(tool)) if tool is not None else self._tools.get(name)
        if spec is not None and name not in (spec.name, spec.decided_as):
            raise InvalidInput(f"the tool given is {spec.name!r:.80}, the call is of {name!r:.80}")
        self._before_use()
        with self._locked() as s:
            decision, event = self.decide_call(name, args, self._in_attention.of(s), principal, spec=spec)
            index = self.services.audit.append(event)
        self.services.events.publish(ToolCallDecided(self.tenant, decision.verdict))
        return replace(decision, audit_index=index)

    def call_context(self) -> CallContext:
        """What a tool-call decision reads of this session now: the refs in attention with their
        segments' producers, and the texts of the live system, user and tool segments."""
        self._before_use()
        with self._locked() as s:
            return self._in_attention.of(s)

    def decide_call(self, name: str, args: Any, context: CallContext, principal: str | None,
                    evidence: EvidenceSource | None = None, spec: ToolSpec | None = None
                    ) -> tuple[ToolCallDecision, DecisionEvent]:
        """The decision on a call in ``context`` (the refs in attention with the producers of their
        segments, the context's texts) and its audit event, not logged: ``authorize_tool_call``
        and ``CallDecider`` log it. A CONFIRM a person already approved in this session for the
        same call under the same rule, offending refs and argument sources is allowed, naming the
        approval (remembered in the state database: ``fak.kernel.calls.held``). ``spec``: the
        tool as declared (the caller's: ``authorize_tool_call`` reads the session's declared
        tools, a turn's decider the request's)."""
        return decide_call(self.services, self.tenant, self.id, self.created_us, name, args, context, principal,
                           evidence, spec=spec)

    def approval_key(self, name: str, args: Any, decision: ToolCallDecision) -> str:
        """What names a held call for a remembered approval (tool, arguments, rule, offending
        refs, triggering sources: ``fak.kernel.calls.records.approval_key``)."""
        return approval_key(name, args_digest(self.services.keys.tool_args_key(), args), decision)

    def remember_approval(self, key: str, approval_index: int, call_id: str = "") -> bool:
        """A person approved the held call ``key`` names: the same call with the same provenance
        is allowed in this session until the approval expires (``approval_ttl_s``), on every
        replica and after a restart (``tool_calls.remember_approvals``); whether it was kept."""
        return remember_approval(self.services, self.tenant, self.id, key, approval_index, call_id)

    def call_decider(self, principal: str | None = None, tools: Sequence[ToolSpec] = ()) -> CallDecider:
        """A decider for the calls of a turn: hand it to ``generate(decider=...)``, which binds it to
        the attention the turn is generated with (read under the turn's lock: generation adds no
        ref to it), so each call the model writes is decided the moment it is written.
        ``tools``: the request's tools (their schemas classify tools no rule names); none given:
        the tools this session declared (``declare_tools``)."""
        return CallDecider(self, principal, tools or tuple(self._tools.values()))

    def evict_refs(
        self, refs: Sequence[str], *, drop_generated: bool = True, reason: str = "tool_call"
    ) -> RefsEvicted:
        """The exact remedy for a DENY or CONFIRM: evict the live tool segments of ``refs``
        (RECOMPUTE) and, with ``drop_generated``, the assistant turns produced while any of them
        was in attention (their tokens may carry what the refs caused, e.g. the call itself).
        The session is then bit-exact to one that never saw them; ask the model again."""
        wanted = frozenset(refs)
        with self.transaction() as tx:
            s = tx.session
            victims = [x for x in s.ledger.live()
                       if (x.kind is SegmentKind.TOOL and x.ref in wanted)
                       or (drop_generated and x.kind is SegmentKind.ASSISTANT and x.content & wanted)]
            if not victims:
                return RefsEvicted([], "bit-exact", s.fingerprint(), [])
            events = [Eviction(tenant=self.tenant, session_id=self.id, segment_id=x.id, ref=x.ref, mode="RECOMPUTE",
                               exact=True, tokens=x.length, reason=as_id(reason)) for x in victims]
            report = tx.change().evict([x.id for x in victims])
            mode = "TRUNCATE" if report.mode is EvictMode.WRITE_TIME else "RECOMPUTE"
            indexes = [tx.audit(ev.model_copy(update={
                "mode": mode, "fingerprint_after": self.services.keys.audit_fingerprint(self.tenant, report.fingerprint)}))
                for ev in events]
            tx.commit(fingerprint=report.fingerprint)
            self.services.events.publish(SpanEvicted(self.tenant, report.mode.value))
            return RefsEvicted([x.id for x in victims], report.exactness, report.fingerprint, indexes)

    # --- generation -----------------------------------------------------------
    def generate(self, params: SamplingParams | None = None, *, keep: bool = True, decider: CallDecider | None = None,
                 receipt: TurnReceipt | None = None, **sampling: Any) -> Iterator[int]:
        """Generate an assistant turn, yielding token ids. Stop tokens come from the model
        unless ``params`` names its own; ``sampling`` overrides fields (max_tokens,
        temperature, top_p, seed, min_tokens, hooks). The turn is kept once the iterator is
        exhausted (with ``keep=False`` it is undone then: a sibling answer); the session
        stays locked until then (close the iterator to give up). ``decider``: bound to the
        turn's attention once the lock is held (``call_decider``); ``receipt``: filled in
        when the turn is kept (the fingerprint it was committed with)."""
        params = self._params(params, sampling)
        return self._generate(params, keep, decider, receipt)

    def _params(self, params: SamplingParams | None, sampling: dict[str, Any]) -> SamplingParams:
        params = params or SamplingParams()
        try:
            params = replace(params, **sampling)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"bad sampling parameters: {exc}") from None
        if not params.stop_token_ids:
            params = replace(params, stop_token_ids=frozenset(self.services.tokenizer.stop_token_ids))
        return params

    def _generate(self, params: SamplingParams, keep: bool = True, decider: CallDecider | None = None,
                  receipt: TurnReceipt | None = None) -> Iterator[int]:
        self._before_use()
        # a place among the generations running at once (or the fair queue, or Overloaded: 429),
        # taken before the session's lock so a queued request holds nothing
        with self.services.generation_slots.slot(self.tenant), self.transaction() as tx:
            s = tx.session
            if decider is not None:
                decider.bind(self._in_attention.of(s), s, s.cache.length)
            room = self.services.context_limit - s.cache.length - GENERATION_OVERHEAD
            if room < 1:
                raise ContextFull(f"the session holds {s.cache.length} tokens: no room left in the "
                                  f"{self.services.context_limit}-token context for an answer")
            if params.max_tokens > room:
                params = replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
            # the turn undoes itself unless exhausted (a consumer that stops early, an error
            # mid-way), so only the write is the transaction's to roll back: commit, no change()
            inner = s.generate(params, keep=keep)
            try:
                t0, count = time.perf_counter(), 0
                while True:
                    # a stream resumes the turn on a thread of its own, in another context: each
                    # step's forward calls are the tenant's there too (the engine's fairness, figures)
                    with tenant_scope(self.tenant):
                        token = next(inner, None)
                    if token is None:
                        break
                    count += 1
                    yield token
            finally:
                inner.close()  # rolls the partial turn back if the consumer stopped early
            if decider is not None:
                try:  # the calls decided while the turn was open are logged before it is kept
                    decider.settle()
                except BaseException:
                    tx.change()  # the turn is in the cache, unlogged: discard it (rebuilt from the ledger)
                    raise
            if keep:
                fingerprint = tx.session.fingerprint()  # hashed once: for the ledger and for the caller
                tx.commit(fingerprint=fingerprint)
                if receipt is not None:
                    receipt.fingerprint = fingerprint
            self.services.events.publish(TokensDecoded(self.tenant, count, time.perf_counter() - t0))

    def chat(self, text: str, **sampling: Any) -> str:
        """Append a user message and return the assistant's answer as text."""
        self.append(SegmentKind.USER, text)
        ids = list(self.generate(**sampling))
        tok = self.services.tokenizer
        return tok.decode_turn(ids)

    # --- working sets ---------------------------------------------------------
    def materialise(self, working_set: WorkingSet | dict[str, Any]) -> MaterialiseResult:
        """Make the session's tool context the working set; see ``fak.kernel.session.materialise``."""
        try:
            ws = working_set if isinstance(working_set, WorkingSet) else WorkingSet.model_validate(working_set)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "working set"
            raise InvalidInput(f"working set {where}: {err['msg']}") from None
        self._before_use()
        with self.transaction() as tx:
            result = materialise(self.services, self.tenant, self.id, tx.change(), ws, tx.audit)
            tx.commit(fingerprint=result.fingerprint)
            return result

    # --- forget and quarantine (driven by the Kernel) ---------------------------
    def evict_derived(self, refs: Collection[str]) -> DerivedEviction:
        """A forget's drop in this session: evict every live segment derived from ``refs`` (their
        tool segments, the generations produced while one was live) and mark them forgotten;
        then, if any survivor still attended to one (a REROPE trace, a PIC chunk computed
        beside it), rebuild exactly. Returns what was dropped, the fingerprint after and a copy
        of the survivors (what the forget's independent replay, ``fak.kernel.withdrawal.replay_check``,
        replays once the forget returned). Several refs (a REDACTed result's two forms): one
        drop, one replay. The caller holds the lock."""
        s = self._loaded()
        wanted = set(refs)
        left_out, self._left_out = self._left_out, []  # the load left them out: this eviction drops them
        victims = [x for x in s.ledger.live() if any(x.derived_from(r) for r in wanted)]
        nodes: list[str] = []
        chunks: list[str] = []
        if victims:
            report = s.evict([x.id for x in victims], force=True)
            nodes = list(report.prefix_nodes_dropped)
            chunks = list(report.pic_chunks_dropped)
            for x in victims:
                x.mark(SegmentState.FORGOTTEN)
        if any(wanted & x.provenance for x in s.ledger.live()) or s.approximate:
            self._mech = s = replayed(self.services, self.tenant, self.id, s)
        survivors = [replace(x, tokens=list(x.tokens), chunks=list(x.chunks)) for x in s.ledger.live()]
        return DerivedEviction(left_out + victims, nodes, chunks, s.fingerprint(), survivors)

    def holds_any(self, refs: Collection[str]) -> bool:
        """Whether a forget of ``refs`` has something to drop here (the lock held): a live
        segment derived from or attending to one, or one its load left out unread."""
        wanted = set(refs)
        return bool(self._left_out) or any(x.derived_from(r) or r in x.provenance
                                           for x in self._loaded().ledger.live() for r in wanted)

    def replay_of(self, segment_ids: Sequence[str]) -> str | None:
        """Fingerprint of an independent replay of the segments ``segment_ids`` (the survivors
        of a forget whose replay a crash interrupted), or None if one of them is no longer
        live (its tokens are gone from the ledger)."""
        with self._locked() as s:
            live = {x.id: x for x in s.ledger.live()}
            if any(i not in live for i in segment_ids):
                return None
            return s.replay_fingerprint([live[i] for i in segment_ids])
