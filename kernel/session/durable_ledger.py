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
from collections.abc import Sequence
from dataclasses import dataclass

from fak.cas.errors import CasError
from fak.errors import NotFound
from fak.kernel.calls.authorize import UNKNOWN_TOOL
from fak.kernel.kv.ledger import Segment, SegmentKind, SegmentState, SegmentView
from fak.kernel.kv.session import Session, SessionOptions, replay
from fak.kernel.services import Services
from fak.policy import VerdictKind
from fak.state.schema import SegmentRow, SessionRow
from fak.state.seal import Plain, needs_seal, seal, unseal
from fak.state.store import ForgetProgress, StateError, now_us, pack_tokens, unpack_tokens
from fak.types import is_tools_block

__all__ = ["CommittedSession", "DurableLedger", "Loaded"]


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

    def load(self, options: SessionOptions) -> Loaded:
        """Replay the durable ledger's live segments (tool bytes FAULT in from the CAS) into a
        ``Session`` built with ``options`` (the recorded chunk size wins), and check that the KV
        reaches the recorded fingerprint; a ledger recorded under another model or with
        approximate KV is not checked (the caller records the replay in its place)."""
        services = self._services
        found = services.state.session(self._tenant, self._id)
        if found is None:
            raise NotFound(f"no session {self._id!r}")  # deleted meanwhile
        head, rows = found
        segments, messages = self._segments(rows)
        options = options.copy()
        options["chunk_size"] = head.chunk_size
        # exact (the fingerprint check needs it); later appends may use PIC
        s = replay(services.model, segments, messages=messages, **options)
        s.ledger.continue_from(head.next_segment)
        fingerprint = s.fingerprint()
        loaded = Loaded(s, fingerprint, model_changed=head.model_id != services.model_id,
                        approximate=head.approximate)
        if not loaded.replaces_record and fingerprint != head.fingerprint:
            raise StateError(f"session {self._id} rebuilt to fingerprint {fingerprint}, "
                             f"the ledger recorded {head.fingerprint}: refusing to serve it")
        return loaded

    def _segments(self, rows: list[SegmentRow]) -> tuple[list[Segment], dict[str, dict[str, str]]]:
        """The ledger's segments (live ones with their tokens) and the messages of the live ones,
        in ledger order."""
        services = self._services
        opened = self._open_sealed(rows)
        segments: list[Segment] = []
        messages: dict[str, dict[str, str]] = {}
        for row in rows:
            kind, state = SegmentKind(row.kind), SegmentState(row.state)
            tool, source, media_type = self._producer(row)
            chunks = json.loads(row.chunks)
            content = frozenset(json.loads(row.content))
            verdict = VerdictKind(row.verdict) if row.verdict is not None else None  # persisted as its string
            if state is not SegmentState.LIVE:
                segments.append(Segment(id=row.id, kind=kind, tokens=[], chunks=[], ref=row.ref, state=state,
                                        verdict=verdict, rule=row.rule, policy_digest=row.policy_digest,
                                        content=content, protected=row.protected,
                                        provenance=frozenset(json.loads(row.attention)), removed_tokens=row.ntokens,
                                        expires_turn=row.expires_turn, tool=tool, source=source,
                                        media_type=media_type))
                continue
            message: dict[str, str] | None
            if kind is SegmentKind.TOOL:
                if not row.ref:
                    raise StateError(f"session {self._id}: tool segment {row.id} has no ref")
                role = services.tokenizer.tools_role if is_tools_block(tool) else None
                message = {"role": role or "tool", "content": services.tool_text(self._tenant, row.ref)}
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
            segments.append(Segment(id=row.id, kind=kind, tokens=tokens, chunks=chunks, ref=row.ref,
                                    verdict=verdict, rule=row.rule, content=content,
                                    policy_digest=row.policy_digest, protected=row.protected,
                                    expires_turn=row.expires_turn, tool=tool, source=source,
                                    media_type=media_type))
        return segments, messages

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
            plain = unseal({x: keys[x] for x in contents[r.id]}, self._tenant, self._id, r.id, ciphertext)
            out[r.id] = plain
            self._sealed[r.id] = (_seal_mark(contents[r.id], plain), ciphertext)
        return out
