"""One conversation's durable ledger: the mechanism under ``KernelSession`` (the policy: when
to write, what a rebuild records, why it happened).

A live ``Session`` becomes one ``SessionRow`` and its ``SegmentRow``s; text derived from tool
content is sealed under its refs' data keys (``fak.state.seal``), so a forget's shred makes it
unreadable in every backup too; tool tokens are not stored (they come back from the CAS). The
rows become a ``Session`` again by replaying the live segments, checked against the recorded
fingerprint (bit-exact: the replay makes the same prefill calls). The ledger is rewritten
whole on every change, so what was sealed is remembered and not sealed again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fak.cas.errors import CasError, Forgotten, KeyDestroyed
from fak.errors import Conflict, NotFound
from fak.kernel.calls.authorize import UNKNOWN_TOOL
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState, SegmentView
from fak.kernel.kv.session import Session, SessionOptions, replay
from fak.kernel.services import Services
from fak.policy import VerdictKind
from fak.state.schema import SegmentRow, SessionRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import ForgetProgress, StateError, now_us, pack_tokens, unpack_tokens
from fak.types import is_tools_block

__all__ = ["CommittedSession", "DurableLedger", "Loaded", "RefsErased"]

log = logging.getLogger(__name__)

ERASED = (KeyDestroyed, Forgotten)  # a ref whose bytes no key opens any more: crypto-erased


class RefsErased(Conflict):
    """A session's live segments derive from refs whose bytes are erased (their data key is
    gone: forgotten since a restored backup, or outside the kernel), so it cannot be replayed
    (409: its state forbids it until the kernel's forget of each ref drops them; ``refs``:
    the refs, sorted)."""

    def __init__(self, session_id: str, tenant: str, refs: Collection[str]) -> None:
        self.refs = sorted(refs)
        fix = "; ".join(f"fak forget {r} --tenant {tenant}" for r in self.refs)
        super().__init__(f"session {session_id} cannot be rebuilt: it holds segments derived from "
                         f"{', '.join(self.refs)}, whose data key is gone (forgotten since a restored backup: "
                         f"fak cas fsck lists them as keyless). Forget each through the kernel to drop them from "
                         f"the session: {fix} (a ref fak cas forget made a tombstone already cannot be: delete "
                         f"the session)")


def _derived(row: SegmentRow, refs: frozenset[str]) -> bool:
    """Whether forgetting one of ``refs`` drops this row (``Segment.derived_from``, on the row)."""
    return bool(refs) and (row.ref in refs or not refs.isdisjoint(json.loads(row.content)))


def _seal_mark(refs: frozenset[str], plain: Plain) -> bytes:
    """What a sealed ciphertext stands for: its refs and plaintext (in memory only)."""
    return hashlib.blake2b(json.dumps(sorted(refs)).encode() + b"\x00" + plain.encode(), digest_size=32).digest()


@dataclass(frozen=True)
class Loaded:
    """A session replayed from its durable ledger, and what the rows said of it."""

    session: Session
    fingerprint: str  # the replay's
    model_changed: bool  # recorded under another model or weight format (FAK_WEIGHTS changed)
    approximate: bool  # REROPE or PIC left KV no replay reproduces
    # live segments of the ledger a forget's load did not read (derived from its refs, or from
    # a ref already erased), rebuilt without their bytes: the forget's eviction reports them
    left_out: tuple[Segment, ...] = ()

    @property
    def replaces_record(self) -> bool:
        """The replay is not the recorded KV but the exact state of the same ledger: it replaces it."""
        return self.model_changed or self.approximate


@dataclass(frozen=True)
class CommittedSession:
    """A session as its durable ledger last recorded it: what a read shows (the REST API, the
    SDK, the console). Read from the rows alone: no lock, no KV, no prefill, no audit entry. It
    is the state the last audited change committed: a turn still running shows once it is kept,
    and a withdrawal left pending on a busy session once that session applies it. The
    fingerprint is the recorded one (a rebuild checks it by replay before the KV is used)."""

    id: str
    tokens: int
    exact_rows: int
    fingerprint: str
    approximate: bool
    segments: tuple[SegmentView, ...]

    def ledger(self) -> list[dict[str, object]]:
        """The segments as JSON-ready dicts (``KernelSession.ledger``'s form)."""
        return [v.as_dict() for v in self.segments]


def committed_of(head: SessionRow, rows: Sequence[SegmentRow]) -> CommittedSession:
    """The rows of a session as a ``CommittedSession``: each live segment starts where the live
    ones before it end (the cache holds the live segments in ledger order, nothing else)."""
    views: list[SegmentView] = []
    start = 0
    for row in rows:
        state = SegmentState(row.state)
        live = state is SegmentState.LIVE
        views.append(SegmentView(
            id=row.id, kind=SegmentKind(row.kind), ref=row.ref, start=start if live else None, length=row.ntokens,
            state=state, verdict=VerdictKind(row.verdict) if row.verdict is not None else None, rule=row.rule,
            provenance=tuple(sorted(json.loads(row.attention))),
            content_provenance=tuple(sorted(json.loads(row.content))), protected=row.protected,
            expires_turn=row.expires_turn,
        ))  # fmt: skip
        start += row.ntokens if live else 0
    exact = head.exact_rows if head.exact_rows is not None else (0 if head.approximate else head.tokens)
    return CommittedSession(id=head.id, tokens=head.tokens, exact_rows=exact, fingerprint=head.fingerprint,
                            approximate=head.approximate, segments=tuple(views))


class DurableLedger:
    """The durable rows of one session (``tenant``, ``session_id``), written and read back."""

    def __init__(self, services: Services, tenant: str, session_id: str, created_us: int) -> None:
        self._services = services
        self._tenant = tenant
        self._id = session_id
        self._created_us = created_us
        # segment id → (what was sealed: a digest of refs and plaintext, the ciphertext): a ledger
        # is rewritten whole on every change, its sealed segments are not re-derived each time
        self._sealed: dict[str, tuple[bytes, bytes | None]] = {}

    # --- writing --------------------------------------------------------------
    def write(self, s: Session, forget: ForgetProgress | None = None, fingerprint: str | None = None) -> None:
        """Write ``s``'s ledger (``forget``: the forget's progress row, in the same database
        transaction); ``fingerprint``: the KV's, when the caller has just computed it (hashing
        the whole KV again is the costliest part of a write)."""
        head, segs = self.rows(s, fingerprint)
        self._services.state.save_session(head, segs, forget)

    def rows(self, s: Session, fingerprint: str | None = None) -> tuple[SessionRow, list[SegmentRow]]:
        """The rows of ``s``: trusted text in the clear, text derived from tool content sealed."""
        services = self._services
        head = SessionRow(
            tenant=self._tenant, id=self._id, created_us=self._created_us, updated_us=now_us(),
            model_id=services.model_id, tokenizer_id=services.tokenizer_id, chunk_size=s.chunk_size,
            next_segment=s.ledger.next_number, fingerprint=fingerprint or s.fingerprint(), tokens=s.cache.length,
            approximate=s.approximate, exact_rows=s.exact_rows, replica=services.settings.replica,
        )  # fmt: skip
        segs = []
        sealed = self._seal_all(s)
        for i, seg in enumerate(s.ledger.segments):
            message = s.message(seg.id)
            keep = seg.live and seg.kind is not SegmentKind.TOOL  # tool tokens come back from the CAS
            ciphertext = sealed.get(seg.id)
            clear = keep and ciphertext is None  # trusted text (no content provenance): in the clear
            segs.append(SegmentRow(
                tenant=self._tenant, session_id=self._id, id=seg.id, seq=i, kind=seg.kind.value,
                state=seg.state.value, ref=seg.ref, verdict=seg.verdict, rule=seg.rule,
                policy_digest=seg.policy_digest, protected=seg.protected, chunks=json.dumps(seg.chunks),
                ntokens=seg.length if seg.live else seg.removed_tokens,
                tokens=pack_tokens(seg.tokens) if clear else None,
                message_role=message["role"] if clear and message else None,
                message_text=message["content"] if clear and message else None,
                sealed=ciphertext if keep else None,
                attention=json.dumps(sorted(seg.provenance)), content=json.dumps(sorted(seg.content)),
                expires_turn=seg.expires_turn, tool=seg.tool, source=seg.source, media_type=seg.media_type,
                producer_mac=self._producer_mac(seg.id, seg.ref, seg.tool, seg.source, seg.media_type),
            ))  # fmt: skip
        return head, segs

    def _producer_mac(self, segment_id: str, ref: str | None, tool: str | None, source: str | None,
                      media_type: str | None) -> str | None:
        if tool is None:
            return None
        return self._services.keys.producer_mac(self._tenant, self._id, segment_id, ref, tool, source, media_type)

    def _producer(self, row: SegmentRow) -> tuple[str | None, str | None, str | None]:
        """A tool row's recorded producer and media type, if its MAC verifies; else unknown
        (judged untrusted, its structure undeclared): whoever can write the database cannot
        raise a segment's trust, give it field paths, nor clear its producer to fall back on
        the ref's record."""
        if row.tool is None:  # a tool row written before producers were recorded (or cleared): unknown
            return (UNKNOWN_TOOL, None, None) if row.kind == SegmentKind.TOOL.value else (None, None, None)
        expected = self._producer_mac(row.id, row.ref, row.tool, row.source, row.media_type)
        if row.producer_mac is None or not hmac.compare_digest(row.producer_mac, expected or ""):
            return UNKNOWN_TOOL, None, None
        return row.tool, row.source, row.media_type

    def _seal_all(self, s: Session) -> dict[str, bytes]:
        """The ciphertext of every live text segment derived from tool content: from the cache
        when its refs and plaintext are unchanged, else sealed now under a key derived from its
        refs' data keys (one key-database read for all new ones)."""
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
                ciphertext = seal(mine, self._tenant, self._id, seg.id, plain) if needs_seal(mine) else None
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
            return self._services.store.content_keys(self._tenant, refs)
        except CasError as exc:
            raise StateError(f"session {self._id}: a segment derives from a ref whose data key is gone ({exc}); "
                             "was it erased outside the kernel (fak cas forget)? Forget it through the kernel "
                             "to drop what derives from it") from exc

    # --- reading --------------------------------------------------------------
    def committed(self) -> CommittedSession:
        """The session as last committed, from its rows alone (``NotFound`` once deleted)."""
        found = self._services.state.committed_ledger(self._tenant, self._id)
        if found is None:
            raise NotFound(f"no session {self._id!r}")
        return committed_of(*found)

    def load(self, options: SessionOptions, dropping: Collection[str] = ()) -> Loaded:
        """Replay the durable ledger's live segments (tool bytes FAULT in from the CAS) into a
        ``Session`` built with ``options`` (the recorded chunk size wins), and check that the KV
        reaches the recorded fingerprint; a ledger recorded under another model or with
        approximate KV is not checked (the caller records the replay in its place).

        ``dropping``: the refs a forget erases. What derives from them is never read (its bytes
        may be erased already: a backup restored after the forget's shred); the survivors are
        replayed, which is exactly a run that never saw them, and no recorded fingerprint can
        be checked. A ref erased already is left out with them (its bytes are gone for good,
        the forget's eviction reports it too); outside a forget it is ``RefsErased``."""
        services = self._services
        found = services.state.session(self._tenant, self._id)
        if found is None:
            raise NotFound(f"no session {self._id!r}")  # deleted meanwhile
        head, rows = found
        segments, messages, left_out = self._segments(rows, frozenset(dropping))
        options = options.copy()
        options["chunk_size"] = head.chunk_size
        # exact (the fingerprint check needs it); later appends may use PIC
        s = replay(services.model, segments, messages=messages, **options)
        s.ledger.continue_from(head.next_segment)
        fingerprint = s.fingerprint()
        loaded = Loaded(s, fingerprint, model_changed=head.model_id != services.model_id,
                        approximate=head.approximate, left_out=tuple(left_out))
        if not loaded.replaces_record and not left_out and fingerprint != head.fingerprint:
            raise StateError(f"session {self._id} rebuilt to fingerprint {fingerprint}, "
                             f"the ledger recorded {head.fingerprint}: refusing to serve it")
        return loaded

    def _segments(self, rows: list[SegmentRow], dropping: frozenset[str]
                  ) -> tuple[list[Segment], dict[str, dict[str, str]], list[Segment]]:
        """The ledger's segments (live ones with their tokens), the messages of the live ones,
        in ledger order, and the live ones left out unread (derived from ``dropping`` or from
        a ref found erased: ``load``)."""
        services = self._services
        live = [r for r in rows if r.state == SegmentState.LIVE.value]
        texts, erased = self._tool_texts(live, dropping)
        opened, erased_sealed = self._open_sealed(live, dropping | erased)
        gone = self._erased(dropping, erased | erased_sealed)
        segments: list[Segment] = []
        messages: dict[str, dict[str, str]] = {}
        left_out: list[Segment] = []
        for row in rows:
            kind, state = SegmentKind(row.kind), SegmentState(row.state)
            if state is not SegmentState.LIVE or _derived(row, gone):
                segments.append(self._absent(row, state))
                if state is SegmentState.LIVE:
                    left_out.append(segments[-1])
                continue
            tool, source, media_type = self._producer(row)
            message: dict[str, str] | None
            if kind is SegmentKind.TOOL:
                if not row.ref:
                    raise StateError(f"session {self._id}: tool segment {row.id} has no ref")
                role = services.tokenizer.tools_role if is_tools_block(tool) else None
                message = {"role": role or "tool", "content": texts[row.id]}
                tokens = services.tokenizer.encode_message(list(messages.values()), message)
            elif row.id in opened:
                plain = opened[row.id]
                tokens = plain.tokens
                message = {"role": plain.role, "content": plain.text or ""} if plain.role else None
            else:
                tokens = unpack_tokens(row.tokens or b"")
                message = {"role": row.message_role, "content": row.message_text or ""} if row.message_role else None
            if len(tokens) != row.ntokens:
                raise StateError(f"session {self._id}: segment {row.id} rebuilt to {len(tokens)} tokens, "
                                 f"the ledger says {row.ntokens}")
            if message is not None:
                messages[row.id] = message
            segments.append(Segment(id=row.id, kind=kind, tokens=tokens, chunks=json.loads(row.chunks),
                                    ref=row.ref, verdict=_verdict(row), rule=row.rule,
                                    content=frozenset(json.loads(row.content)), policy_digest=row.policy_digest,
                                    protected=row.protected, expires_turn=row.expires_turn, tool=tool,
                                    source=source, media_type=media_type))
        return segments, messages, left_out

    def _erased(self, dropping: frozenset[str], erased: frozenset[str]) -> frozenset[str]:
        """The refs whose segments a load leaves out: a forget's, and any found erased (outside
        a forget, an erased ref refuses the rebuild: ``RefsErased``)."""
        if not erased:
            return dropping
        if not dropping:
            raise RefsErased(self._id, self._tenant, erased)
        log.warning("session %s: %s erased already (data key gone): the forget of %s drops their segments too; "
                    "fak forget each for its own receipt", self._id, ", ".join(sorted(erased)),
                    ", ".join(sorted(dropping)))
        return dropping | erased

    def _absent(self, row: SegmentRow, state: SegmentState) -> Segment:
        """A segment without its tokens: out of the KV (evicted, quarantined, forgotten), or a
        live one left out unread (marked forgotten: the forget that left it out drops it)."""
        tool, source, media_type = self._producer(row)
        live = state is SegmentState.LIVE
        return Segment(id=row.id, kind=SegmentKind(row.kind), tokens=[], chunks=[], ref=row.ref,
                       state=SegmentState.FORGOTTEN if live else state, verdict=_verdict(row), rule=row.rule,
                       policy_digest=row.policy_digest, content=frozenset(json.loads(row.content)),
                       protected=row.protected, provenance=frozenset(json.loads(row.attention)),
                       removed_tokens=row.ntokens, expires_turn=row.expires_turn, tool=tool, source=source,
                       media_type=media_type)

    def _tool_texts(self, live: list[SegmentRow], skip: frozenset[str]) -> tuple[dict[str, str], frozenset[str]]:
        """The text of each live tool row not derived from ``skip`` (bytes from the CAS, by
        segment id), and the refs whose bytes are erased."""
        texts: dict[str, str] = {}
        erased: set[str] = set()
        for row in live:
            if row.kind != SegmentKind.TOOL.value or not row.ref or _derived(row, skip):
                continue
            try:
                texts[row.id] = self._services.tool_text(self._tenant, row.ref)
            except ERASED:
                erased.add(row.ref)
        return texts, frozenset(erased)

    def _open_sealed(self, live: list[SegmentRow], skip: frozenset[str]) -> tuple[dict[str, Plain], frozenset[str]]:
        """Open the live sealed rows not derived from ``skip`` (their refs' data keys read
        once) and remember their ciphertext, so the next write does not seal them again;
        with the refs whose data key is gone (their rows stay closed)."""
        sealed = [(r, r.sealed) for r in live if r.sealed is not None and not _derived(r, skip)]
        if not sealed:
            return {}, frozenset()
        contents = {r.id: frozenset(json.loads(r.content)) for r, _ in sealed}
        keys, erased = self._keys_left(frozenset().union(*contents.values()))
        out: dict[str, Plain] = {}
        for r, ciphertext in sealed:
            if not erased.isdisjoint(contents[r.id]):
                continue
            plain = unseal({x: keys[x] for x in contents[r.id]}, self._tenant, self._id, r.id, ciphertext)
            out[r.id] = plain
            self._sealed[r.id] = (_seal_mark(contents[r.id], plain), ciphertext)
        return out, erased

    def _keys_left(self, refs: frozenset[str]) -> tuple[dict[str, bytes], frozenset[str]]:
        """The data keys of ``refs`` that are still there, and the refs whose key is gone (one
        key-database read; one per ref only when one is gone)."""
        try:
            return self._content_keys(refs), frozenset()
        except StateError as exc:
            if not isinstance(exc.__cause__, ERASED):
                raise
        keys: dict[str, bytes] = {}
        erased: set[str] = set()
        for r in sorted(refs):
            try:
                keys.update(self._services.store.content_keys(self._tenant, [r]))
            except ERASED:
                erased.add(r)
        return keys, frozenset(erased)


def _verdict(row: SegmentRow) -> VerdictKind | None:
    """A row's verdict (persisted as its string)."""
    return VerdictKind(row.verdict) if row.verdict is not None else None
