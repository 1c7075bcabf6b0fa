"""A kernel session: one conversation's KV (``fak.kernel.kv.session.Session``), its
lock, its durable ledger, and the audited operations on it.

Every operation is all or nothing: each change runs in one ``transaction()``
(``fak.kernel.transaction``), which validates the audit event before anything changes,
changes the in-memory session, appends the event, and only then writes the ledger to
the database. If the append or the write fails, the in-memory session is discarded and
rebuilt from the durable ledger on next use (bit-exact: replay makes the same prefill
calls), so no failure leaves a half-applied change behind. A generated turn is kept only
when its iterator is exhausted; a consumer that stops early leaves cache and ledger as
they were.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from fak.audit import AdmissionVerdict, Eviction, SessionRebuilt
from fak.audit import ToolCallDecision as DecisionEvent
from fak.cas.errors import CasError
from fak.errors import Conflict, Forbidden, InvalidInput, NotFound
from fak.kernel.authorize import ToolCallDecision, args_digest
from fak.kernel.events import AdmissionDecided, SpanEvicted, TokensDecoded, ToolCallDecided
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState
from fak.kernel.kv.pic_serve import PicBinding
from fak.kernel.kv.session import EvictionReport, EvictMode, PrefixBinding, Session, SessionOptions, replay
from fak.kernel.materialise import MaterialiseResult, WorkingSet, materialise
from fak.kernel.model.generate import SamplingParams
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.services import Services, SessionBusy
from fak.kernel.transaction import ForgetProgress, Transaction
from fak.kernel.withdraw import evict_in_place, expire, expire_due, lifetime
from fak.policy import GateContext, Verdict, VerdictKind
from fak.policy.late import LateJob
from fak.state.schema import SegmentRow, SessionRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import StateError, now_us, pack_tokens, unpack_tokens
from fak.types import as_id, check_id

__all__ = ["GENERATION_OVERHEAD", "MAX_SOURCE", "MAX_TEXT_BYTES", "QUARANTINED_RULE", "Admission", "ContextFull",
           "KernelSession", "RefBeingForgotten", "RefsEvicted", "SessionBusy"]

MAX_TEXT_BYTES = 1 << 20
MAX_SOURCE = 2048  # characters of a tool result's source URL
GENERATION_OVERHEAD = 16  # tokens an answer needs besides its own: the turn's opener and closing
QUARANTINED_RULE = "ref_quarantined"  # the rule of an admission refused because of a late quarantine


class ContextFull(Conflict):
    """The session's context would pass the model's (or the configured) length."""

    code = "context_full"


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
class RefsEvicted:
    """What ``evict_refs`` removed: segment ids, the exactness word, the fingerprint after,
    and the audit index of each segment's ``Eviction`` event."""

    segment_ids: list[str]
    exactness: str
    fingerprint: str
    audit_indexes: list[int]


def _turns(s: Session) -> int:
    """Model turns the session has had: assistant segments in its ledger, whatever their state."""
    return sum(1 for x in s.ledger.segments if x.kind is SegmentKind.ASSISTANT)


def _seal_mark(refs: frozenset[str], plain: Plain) -> bytes:
    """What a sealed ciphertext stands for: its refs and plaintext (in memory only)."""
    return hashlib.blake2b(json.dumps(sorted(refs)).encode() + b"\x00" + plain.encode(), digest_size=32).digest()




class KernelSession:
    """Get one from ``Kernel.session(tenant, id)``; thread-safe (one lock per session)."""

    def __init__(self, services: Services, tenant: str, session_id: str, created_us: int, *, fresh: bool) -> None:
        self.services = services
        self.tenant = tenant
        self.id = session_id
        self.created_us = created_us
        self._lock = threading.Lock()
        self._mech: Session | None = None
        self._cause = "restart"  # why the next rebuild happens (for the SessionRebuilt event)
        self._attention_cache: tuple[tuple[int, int, int], dict[str, tuple[str, str | None]]] | None = None
        # segment id → (what was sealed: a digest of refs and plaintext, the ciphertext): a ledger
        # is rewritten whole on every change, its sealed segments are not re-derived each time
        self._sealed: dict[str, tuple[bytes, bytes | None]] = {}
        self.last_used = time.monotonic()
        if fresh:
            self._mech = self._new_mech()
            self._persist()

    # --- locking and loading --------------------------------------------------
    @contextmanager
    def _locked(self, wait: bool = True) -> Iterator[Session]:
        self._acquire(wait)
        try:
            s = self._loaded()
            self._settle(s)
            s = self._loaded()
            s.pic = self._pic_binding()  # the active policy decides, also after a reload
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
        k = self.services
        pending = k.withdrawals.pending(self.tenant)
        live = s.ledger.live()
        if pending:
            # its own segments of a pending ref, or rows that attended to one (PIC chunks)
            due = {r: state for r, state in pending.items() if any(x.ref == r or r in x.provenance for x in live)}
            if due:
                evict_in_place(k, self, s, due)
                live = s.ledger.live()
        expiring = [x for x in live if x.expires_turn is not None]
        if expiring:
            turns = _turns(s)
            for ref in dict.fromkeys(x.ref for x in expiring
                                     if x.expires_turn is not None and turns >= x.expires_turn and x.ref):
                expire(k, self.tenant, ref, cause="turns", held=self)

    def _before_use(self) -> None:
        """Execute expiries whose time has come before attention is used (outside any lock)."""
        if self.services.withdrawals.expiry_due():
            expire_due(self.services, tenant=self.tenant)

    def _release(self) -> None:
        self.last_used = time.monotonic()
        self._lock.release()
        self.services.sessions.enforce_kv_budget(keep=self)

    def _loaded(self) -> Session:
        if self._mech is None:
            self._mech = self._rebuild()
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
    def transaction(self, wait: bool = True) -> Iterator[Transaction]:
        """One audited change: the lock taken, the session loaded, pending withdrawals settled;
        a failure once ``tx.change()`` was called rolls back (``fak.kernel.transaction``)."""
        with self._locked(wait), Transaction(self, self.services.audit.append) as tx:
            yield tx

    def held_transaction(self) -> Transaction:
        """A transaction for a caller that already holds the lock (a settle, a withdrawal)."""
        return Transaction(self, self.services.audit.append)

    # --- for the withdrawal paths (fak.kernel.forget, fak.kernel.withdraw) and the façade ------
    def locked(self, wait: bool = True) -> AbstractContextManager[Session]:
        """The session under its lock, loaded and with pending withdrawals settled: what a
        delete holds while it removes the session (a change goes through ``transaction``)."""
        return self._locked(wait)

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
        The rollback primitive: only ``fak.kernel.transaction`` calls it."""
        self._mech = None
        self._cause = "rollback"

    def unload(self) -> None:
        """Drop the in-memory session of a deleted session (its lock is held)."""
        self._mech = None

    def replace_with_replay(self, s: Session) -> Session:
        """Swap ``s`` for an exact replay of its ledger (rows attended to a withdrawn ref)."""
        self._mech = self._replayed(s)
        return self._mech

    def drop_derived(
        self, ref: str | Collection[str], *, forget: bool
    ) -> tuple[list[Segment], list[str], list[str], str, list[Segment]]:
        """Evict what derives from ``ref`` (forget) or carries it (quarantine); see ``_drop_derived``."""
        return self._drop_derived(ref, forget=forget)

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

    def _binding(self) -> PrefixBinding | None:
        k = self.services
        policy = k.policy
        if k.prefix is None or not policy.spec.reuse.prefix:
            return None
        return PrefixBinding(k.prefix, k.keys.namespace(self.tenant), priority=policy.spec.retention.cache_priority)

    def _pic_binding(self) -> PicBinding | None:
        """PIC only where the active policy allows approximate reuse."""
        k = self.services
        if not k.policy.spec.reuse.pic_approximate:
            return None
        return PicBinding(k.pic, k.keys.namespace(self.tenant), recompute_first=k.settings.pic_recompute_first,
                          blend_fraction=k.settings.pic_blend_fraction)

    def _mech_options(self) -> SessionOptions:
        """What this conversation's ``Session`` is built with besides the model."""
        k = self.services
        return SessionOptions(
            tokenizer=k.tokenizer,
            session_id=self.id,
            tenant=self.tenant,
            chunk_size=k.settings.chunk_size,
            protected_kinds=k.policy.spec.protected_kinds,
            prefix=self._binding(),
            pic=self._pic_binding(),
        )

    def _new_mech(self) -> Session:
        return Session(self.services.model, **self._mech_options())

    # --- durable ledger -------------------------------------------------------
    def _rows(self, s: Session, fingerprint: str | None = None) -> tuple[SessionRow, list[SegmentRow]]:
        k = self.services
        head = SessionRow(
            tenant=self.tenant, id=self.id, created_us=self.created_us, updated_us=now_us(), model_id=k.model_id,
            tokenizer_id=k.tokenizer_id, chunk_size=s.chunk_size, next_segment=s.ledger.next_number,
            fingerprint=fingerprint or s.fingerprint(), tokens=s.cache.length, approximate=s.approximate,
        )  # fmt: skip
        segs = []
        sealed = self._seal_all(s)
        for i, seg in enumerate(s.ledger.segments):
            message = s.message(seg.id)
            keep = seg.live and seg.kind is not SegmentKind.TOOL  # tool tokens come back from the CAS
            ciphertext = sealed.get(seg.id)
            clear = keep and ciphertext is None  # trusted text (no content provenance): in the clear
            segs.append(SegmentRow(
                tenant=self.tenant, session_id=self.id, id=seg.id, seq=i, kind=seg.kind.value,
                state=seg.state.value, ref=seg.ref, verdict=seg.verdict, rule=seg.rule,
                policy_digest=seg.policy_digest, protected=seg.protected, chunks=json.dumps(seg.chunks),
                ntokens=seg.length if seg.live else seg.removed_tokens,
                tokens=pack_tokens(seg.tokens) if clear else None,
                message_role=message["role"] if clear and message else None,
                message_text=message["content"] if clear and message else None,
                sealed=ciphertext if keep else None,
                attention=json.dumps(sorted(seg.provenance)), content=json.dumps(sorted(seg.content)),
                expires_turn=seg.expires_turn,
            ))  # fmt: skip
        return head, segs

    def _seal_all(self, s: Session) -> dict[str, bytes]:
        """The ciphertext of every live text segment derived from tool content (``fak.state.seal``):
        from the cache when its refs and plaintext are unchanged, else sealed now under a key
        derived from its refs' data keys (one key-database read for all new ones)."""
        out: dict[str, bytes] = {}
        todo: list[tuple[Segment, Plain, bytes]] = []
        for seg in s.ledger.live():
            if seg.kind is SegmentKind.TOOL or not seg.content:
                continue
            message = s.message(seg.id)
            plain = Plain(list(seg.tokens), message["role"] if message else None, message["content"] if message else None)
            mark = _seal_mark(seg.content, plain)
            cached = self._sealed.get(seg.id)
            if cached is not None and cached[0] == mark:
                if cached[1] is not None:
                    out[seg.id] = cached[1]
                continue
            todo.append((seg, plain, mark))
        if todo:
            keys = self._content_keys(frozenset().union(*(seg.content for seg, _, _ in todo)))
            for seg, plain, mark in todo:
                mine = {r: keys[r] for r in seg.content}
                ciphertext = seal(mine, self.tenant, self.id, seg.id, plain) if needs_seal(mine) else None
                self._sealed[seg.id] = (mark, ciphertext)
                if ciphertext is not None:
                    out[seg.id] = ciphertext
        live = {seg.id for seg in s.ledger.live()}
        for sid in [x for x in self._sealed if x not in live]:
            del self._sealed[sid]
        return out

    def _content_keys(self, refs: frozenset[str]) -> dict[str, bytes]:
        """The data keys of ``refs``, to seal or open what derives from them."""
        try:
            return self.services.store.content_keys(self.tenant, refs)
        except CasError as exc:
            raise StateError(f"session {self.id}: a segment derives from a ref whose data key is gone ({exc}); "
                             "was it erased outside the kernel (fak cas forget)? Forget it through the kernel "
                             "to drop what derives from it") from exc

    def _persist(self, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None:
        """Write the ledger; ``fingerprint``: the KV's, when the caller has just computed it
        (hashing the whole KV again is the costliest part of a write)."""
        head, segs = self._rows(self._loaded(), fingerprint)
        self.services.state.save_session(head, segs, forget)

    def _rebuild(self) -> Session:
        """Replay the durable ledger's live segments (tool bytes FAULT in from the CAS) and
        check that the KV reaches the recorded fingerprint."""
        k = self.services
        found = k.state.session(self.tenant, self.id)
        if found is None:
            raise NotFound(f"no session {self.id!r}")  # deleted meanwhile
        head, rows = found
        opened = self._open_sealed(rows)
        segments: list[Segment] = []
        messages: dict[str, dict[str, str]] = {}  # of the live segments, in ledger order
        for row in rows:
            kind, state = SegmentKind(row.kind), SegmentState(row.state)
            chunks = json.loads(row.chunks)
            content = frozenset(json.loads(row.content))
            verdict = VerdictKind(row.verdict) if row.verdict is not None else None  # persisted as its string
            if state is not SegmentState.LIVE:
                segments.append(Segment(id=row.id, kind=kind, tokens=[], chunks=[], ref=row.ref, state=state,
                                        verdict=verdict, rule=row.rule, policy_digest=row.policy_digest,
                                        content=content, protected=row.protected,
                                        provenance=frozenset(json.loads(row.attention)), removed_tokens=row.ntokens,
                                        expires_turn=row.expires_turn))
                continue
            message: dict[str, str] | None
            if kind is SegmentKind.TOOL:
                if not row.ref:
                    raise StateError(f"session {self.id}: tool segment {row.id} has no ref")
                message = {"role": "tool", "content": k.tool_text(self.tenant, row.ref)}
                tokens = k.tokenizer.encode_message(list(messages.values()), message)
            elif row.id in opened:
                plain = opened[row.id]
                tokens = plain.tokens
                message = {"role": plain.role, "content": plain.text or ""} if plain.role else None
            else:
                tokens = unpack_tokens(row.tokens or b"")
                message = {"role": row.message_role, "content": row.message_text or ""} if row.message_role else None
            if len(tokens) != row.ntokens:
                raise StateError(f"session {self.id}: segment {row.id} rebuilt to {len(tokens)} tokens, "
                                 f"the ledger says {row.ntokens}")
            if message is not None:
                messages[row.id] = message
            segments.append(Segment(id=row.id, kind=kind, tokens=tokens, chunks=chunks, ref=row.ref,
                                    verdict=verdict, rule=row.rule, content=content,
                                    policy_digest=row.policy_digest, protected=row.protected,
                                    expires_turn=row.expires_turn))
        options = self._mech_options()
        options["chunk_size"] = head.chunk_size
        # exact (the fingerprint check needs it); later appends may use PIC
        s = replay(k.model, segments, messages=messages, **options)
        s.ledger.continue_from(head.next_segment)
        fingerprint = s.fingerprint()
        if head.model_id != k.model_id:
            # recorded under another model or weight format (FAK_WEIGHTS changed): the same
            # ledger computes other bytes here; the replay becomes the state, and says why
            self._cause = "model_changed" if self._cause != "rollback" else self._cause
            self._mech = s
            self._persist(fingerprint=fingerprint)
        elif head.approximate:
            # REROPE or PIC left KV no replay reproduces; the replay is the exact state of the
            # same ledger (what RECOMPUTE would have given), so it replaces it, and is recorded
            self._mech = s
            self._persist(fingerprint=fingerprint)
        elif fingerprint != head.fingerprint:
            raise StateError(f"session {self.id} rebuilt to fingerprint {fingerprint}, "
                             f"the ledger recorded {head.fingerprint}: refusing to serve it")
        if self._cause != "rollback":  # a rollback restores the last logged state: nothing new to record
            k.audit.append(SessionRebuilt(
                tenant=self.tenant, session_id=self.id, segments=len(s.ledger.live()), tokens=s.cache.length,
                fingerprint=k.keys.audit_fingerprint(self.tenant, fingerprint), cause=self._cause))
        self._cause = "restart"
        return s

    def _open_sealed(self, rows: list[SegmentRow]) -> dict[str, Plain]:
        """Open the live sealed rows of a ledger (their refs' data keys read once) and
        remember their ciphertext, so the next write does not seal them again."""
        sealed = [(r, r.sealed) for r in rows if r.sealed is not None and r.state == SegmentState.LIVE.value]
        if not sealed:
            return {}
        contents = {r.id: frozenset(json.loads(r.content)) for r, _ in sealed}
        keys = self._content_keys(frozenset().union(*contents.values()))
        out: dict[str, Plain] = {}
        for r, ciphertext in sealed:
            plain = unseal({x: keys[x] for x in contents[r.id]}, self.tenant, self.id, r.id, ciphertext)
            out[r.id] = plain
            self._sealed[r.id] = (_seal_mark(contents[r.id], plain), ciphertext)
        return out

    # --- reading --------------------------------------------------------------
    def ledger(self) -> list[dict[str, object]]:
        """The ledger as the API and audit may show it: ids, digests, verdicts, provenance."""
        with self._locked() as s:
            return [seg.summary() for seg in s.ledger.segments]

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

    def refs(self) -> set[str]:
        """Every ref in the attention provenance of the live KV."""
        with self._locked() as s:
            return s.refs()

    # --- appending text -------------------------------------------------------
    def append(self, kind: SegmentKind | str, text: str) -> Segment:
        """Append a system, user or assistant message (tool results go through ``admit``).
        An assistant message given as text (a client resending a history, another model's
        turn) gets the content provenance of every ref live now, as a generated turn would."""
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
            seg = s.append(kind, text, content=content)
            self._check_room(s, f"this {kind.value} message")
            tx.commit()
            return seg

    # --- tool results ---------------------------------------------------------
    def admit(
        self, tool: str, data: bytes, *, media_type: str = "text/plain", tags: Sequence[str] = (),
        source: str | None = None,
    ) -> Admission:
        """A tool result's path into attention: CAS put → gate → verdict → audit event.

        ``ALLOW``: appended as a tool segment carrying the ref. ``REDACT``: the redacted
        bytes are stored as their own ref and appended. ``QUARANTINE``/``DENY``: recorded in
        the ledger, never prefilled (== never saw it). In audit-only policy mode the bytes
        are admitted and the event records what the policy would have done. ``source``: the URL
        the result came from (rules, exceptions and trust may depend on its host)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidInput("a tool result is bytes")
        data = bytes(data)
        if not isinstance(tool, str) or not tool:
            raise InvalidInput("tool must be a non-empty string")
        tags = [check_id(t) for t in tags]
        if source is not None and (not isinstance(source, str) or len(source) > MAX_SOURCE or not source.isprintable()):
            raise InvalidInput(f"source is a URL of at most {MAX_SOURCE} printable characters")
        k = self.services
        self._before_use()
        with self.transaction() as tx:
            s = tx.session
            policy = k.policy
            if k.state.forget_pending(self.tenant, k.store.digest_of(data, self.tenant)):
                raise RefBeingForgotten("these bytes are being forgotten; admit them again once the forget completed")
            ref = k.store.put(data, media_type, self.tenant).digest
            meta = k.state.ref(self.tenant, ref)
            if meta is not None and meta.quarantined:
                # a late detection already judged these bytes: a resend must not undo it
                verdict = Verdict(kind=VerdictKind.QUARANTINE, rule_id=QUARANTINED_RULE,
                                  policy_digest=policy.digest, tool=tool, input_bytes=len(data))
            else:
                verdict = k.gate(policy, tool, data,
                                 GateContext(media_type=media_type, source=source, tenant=self.tenant,
                                             session=self.id, ref=ref))
            kind = verdict.kind if verdict.enforced else VerdictKind.ALLOW
            admitted = kind in (VerdictKind.ALLOW, VerdictKind.REDACT)
            body, admitted_ref = data, (ref if admitted else None)
            if kind is VerdictKind.REDACT and verdict.redacted_bytes is not None:
                body = verdict.redacted_bytes
                derived = k.store.digest_of(body, self.tenant)
                if derived != ref:
                    if k.state.forget_pending(self.tenant, derived):
                        raise RefBeingForgotten("the redacted form of these bytes is being forgotten; admit them "
                                                "again once the forget completed")
                    # linked before the redacted bytes are stored: a forget of either form finds both
                    k.state.link_refs(self.tenant, ref, derived)
                admitted_ref = k.store.put(body, media_type, self.tenant).digest
            segment_id = s.ledger.new_id()
            event = AdmissionVerdict(  # validated before anything changes
                tenant=self.tenant, session_id=self.id, segment_id=segment_id, tool=as_id(tool), ref=ref,
                size=len(data), verdict=verdict.kind.value, rule_id=as_id(verdict.rule_id),
                policy_digest=verdict.policy_digest,
                admitted_ref=admitted_ref if admitted_ref != ref else None, trust=verdict.trust,
                audited=[as_id(a.rule_id) for a in verdict.audited],
                exempted=sorted({as_id(e.exception_id) for e in verdict.exempted}),
            )  # fmt: skip
            expires_us = None
            if admitted:
                seconds, turns = lifetime(policy, tool, verdict, source)
                expires_us = now_us() + seconds * 1_000_000 if seconds is not None else None
            tx.change()
            if admitted:
                segment = s.append(SegmentKind.TOOL, body.decode("utf-8", errors="replace"), ref=admitted_ref,
                                   verdict=verdict.kind.value, rule=verdict.rule_id,
                                   policy_digest=policy.digest, segment_id=segment_id)
                segment.expires_turn = _turns(s) + turns if turns is not None else None
                self._check_room(s, "this tool result")
            else:
                segment = s.record_quarantined(SegmentKind.TOOL, ref=ref, verdict=verdict.kind.value,
                                               rule=verdict.rule_id, policy_digest=policy.digest,
                                               segment_id=segment_id)
            index = tx.audit(event)
            if admitted and admitted_ref is not None:
                k.state.record_ref(self.tenant, admitted_ref, tool, tags, verdict.kind.value, policy.digest,
                                   expires_us=expires_us, source=source)
                k.store.record_use(admitted_ref, self.tenant, "segment", f"{self.id}/{segment.id}")
                k.producers.note(self.tenant, admitted_ref, (tool, source))
                k.withdrawals.note_expiry(expires_us)
                k.withdrawals.clear(self.tenant, admitted_ref, SegmentState.EXPIRED)  # admitted again: a new lifetime
            if admitted_ref != ref:
                k.state.record_ref(self.tenant, ref, tool, tags, verdict.kind.value, policy.digest,
                                   source=source)
                k.producers.note(self.tenant, ref, (tool, source))
            if not admitted:
                k.store.set_taint(ref, self.tenant, "quarantined")
            tx.commit()
            k.events.publish(AdmissionDecided(self.tenant, verdict.kind))
            if admitted and admitted_ref is not None:
                self._late_check(tool, admitted_ref, body, verdict.trust or "untrusted")
            return Admission(verdict, ref, admitted_ref, segment, index)

    def _late_check(self, tool: str, ref: str, body: bytes, trust: str) -> None:
        """Hand an admitted result to the late detectors, with the trust the gate applied."""
        k = self.services
        if k.late.runner is None:
            return
        k.late.submit(LateJob(tenant=self.tenant, session=self.id, ref=ref, tool=tool, trust=trust,
                              text=body.decode("utf-8", errors="replace"), admitted_at=time.time()), k.policy)

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
    def authorize_tool_call(self, name: str, args: Any = None, *, principal: str | None = None) -> ToolCallDecision:
        """May the agent call tool ``name`` now? ``ALLOW | CONFIRM | DENY`` from the policy's
        ``tool_calls`` rules over the refs in the attention provenance of the live context,
        with the offending refs and the rule; logged (the arguments as a keyed digest only).
        Whoever generated the call: this session's model, or a framework's model reporting it."""
        if not isinstance(name, str) or not name or len(name) > 128:
            raise InvalidInput("a tool name is a non-empty string of at most 128 characters")
        k = self.services
        digest = args_digest(k.keys.tool_args_key(), args)
        self._before_use()
        with self._locked() as s:
            producers = self._attention(s)
            decision = k.authorizers.current(k.policy).decide(name, producers)
            event = DecisionEvent(
                tenant=self.tenant, session_id=self.id, tool=as_id(name), args_digest=digest,
                verdict=decision.verdict, rule_id=as_id(decision.rule_id) if decision.rule_id else None,
                offending=list(decision.offending), attention_refs=decision.attention_refs,
                policy_digest=decision.policy_digest, enforced=decision.enforced, would_be=decision.would_be,
                audited=[as_id(r) for r in decision.audited], principal=as_id(principal) if principal else None,
            )  # fmt: skip
            index = k.audit.append(event)
        k.events.publish(ToolCallDecided(self.tenant, decision.verdict))
        return replace(decision, audit_index=index)

    def _attention(self, s: Session) -> dict[str, tuple[str, str | None]]:
        """Refs in the attention provenance of the live KV, each with the tool that produced
        it; cached until the ledger changes: every change appends a segment (more segments)
        or evicts one (fewer rows), so (session object, segments, rows) names a state."""
        key = (id(s), len(s.ledger.segments), s.cache.length)
        cached = self._attention_cache
        if cached is None or cached[0] != key:
            refs = sorted(frozenset().union(*(x.provenance for x in s.ledger.live())))
            producers = {ref: self.services.producers.of(self.tenant, ref) for ref in refs}
            cached = self._attention_cache = (key, producers)
        return cached[1]

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
    def generate(self, params: SamplingParams | None = None, **sampling: Any) -> Iterator[int]:
        """Generate an assistant turn, yielding token ids. Stop tokens come from the model
        unless ``params`` names its own; ``sampling`` overrides fields (max_tokens,
        temperature, top_p, seed, min_tokens). The turn is kept once the iterator is
        exhausted; the session stays locked until then (close the iterator to give up)."""
        params = self._params(params, sampling)
        return self._generate(params)

    def _params(self, params: SamplingParams | None, sampling: dict[str, Any]) -> SamplingParams:
        params = params or SamplingParams()
        try:
            params = replace(params, **sampling)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"bad sampling parameters: {exc}") from None
        if not params.stop_token_ids:
            params = replace(params, stop_token_ids=frozenset(self.services.tokenizer.stop_token_ids))
        return params

    def _generate(self, params: SamplingParams) -> Iterator[int]:
        self._before_use()
        with self.transaction() as tx:
            s = tx.session
            room = self.services.context_limit - s.cache.length - GENERATION_OVERHEAD
            if room < 1:
                raise ContextFull(f"the session holds {s.cache.length} tokens: no room left in the "
                                  f"{self.services.context_limit}-token context for an answer")
            if params.max_tokens > room:
                params = replace(params, max_tokens=room, min_tokens=min(params.min_tokens, room))
            # the turn undoes itself unless exhausted (a consumer that stops early, an error
            # mid-way), so only the write is the transaction's to roll back: commit, no change()
            inner = s.generate(params)
            try:
                t0, count = time.perf_counter(), 0
                for token in inner:
                    count += 1
                    yield token
            finally:
                inner.close()  # rolls the partial turn back if the consumer stopped early
            tx.commit()
            self.services.events.publish(TokensDecoded(self.tenant, count, time.perf_counter() - t0))

    def chat(self, text: str, **sampling: Any) -> str:
        """Append a user message and return the assistant's answer as text."""
        self.append(SegmentKind.USER, text)
        ids = list(self.generate(**sampling))
        tok = self.services.tokenizer
        return tok.decode_turn(ids)

    # --- working sets ---------------------------------------------------------
    def materialise(self, working_set: WorkingSet | dict[str, Any]) -> MaterialiseResult:
        """Make the session's tool context the working set; see ``fak.kernel.materialise``."""
        try:
            ws = working_set if isinstance(working_set, WorkingSet) else WorkingSet.model_validate(working_set)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "working set"
            raise InvalidInput(f"working set {where}: {err['msg']}") from None
        self._before_use()
        with self.transaction() as tx:
            result = materialise(self.services, self.tenant, self.id, tx.change(), ws)
            tx.commit(fingerprint=result.fingerprint)
            return result

    # --- forget and quarantine (driven by the Kernel) ---------------------------
    def _drop_derived(
        self, ref: str | Collection[str], *, forget: bool
    ) -> tuple[list[Segment], list[str], list[str], str, list[Segment]]:
        """Evict every live segment derived from ``ref`` (forget) or carrying it (quarantine);
        then, if any survivor still attended to it (a REROPE trace, a PIC chunk computed
        beside it), rebuild exactly. Returns the dropped segments, the prefix-cache nodes and
        PIC chunks dropped with them, the fingerprint after and a copy of the survivors (what
        the forget's independent replay, ``fak.kernel.replay``, replays once the forget returned).
        ``ref`` may be several refs (a REDACTed result's two forms): one drop, one replay.
        The caller holds the lock."""
        s = self._loaded()
        refs = {ref} if isinstance(ref, str) else set(ref)
        victims = [x for x in s.ledger.live()
                   if any((x.derived_from(r) if forget else x.ref == r) for r in refs)]
        nodes: list[str] = []
        chunks: list[str] = []
        if victims:
            report = s.evict([x.id for x in victims], force=True)
            nodes = list(report.prefix_nodes_dropped)
            chunks = list(report.pic_chunks_dropped)
            if forget:
                for x in victims:
                    x.mark(SegmentState.FORGOTTEN)
        if any(refs & x.provenance for x in s.ledger.live()) or s.approximate:
            self._mech = s = self._replayed(s)
        survivors = [replace(x, tokens=list(x.tokens), chunks=list(x.chunks)) for x in s.ledger.live()]
        return victims, nodes, chunks, s.fingerprint(), survivors

    def replay_of(self, segment_ids: Sequence[str]) -> str | None:
        """Fingerprint of an independent replay of the segments ``segment_ids`` (the survivors
        of a forget whose replay a crash interrupted), or None if one of them is no longer
        live (its tokens are gone from the ledger)."""
        with self._locked() as s:
            live = {x.id: x for x in s.ledger.live()}
            if any(i not in live for i in segment_ids):
                return None
            return s.replay_fingerprint([live[i] for i in segment_ids])

    def _replayed(self, s: Session) -> Session:
        """A fresh exact session with the same ledger (live segments replayed)."""
        messages = {x.id: m for x in s.ledger.live() if (m := s.message(x.id)) is not None}
        fresh = replay(self.services.model, s.ledger.segments, messages=messages, **self._mech_options())
        fresh.ledger.continue_from(s.ledger.next_number)
        return fresh
