"""A session: one conversation's KV cache plus the ledger of what is in it.

This module holds the session's state and its public verbs; each verb's mechanism is a
module of its own:

- ``append`` prefills a segment (chat-rendered text or raw tokens) in recorded chunks,
  through the prefix cache and PIC when bound (``kernel/kv/prefill.py``);
- ``generate`` produces an assistant turn, all or nothing (``kernel/kv/generation.py``);
- ``evict`` removes any live segments (one is a list of one) in one step, write-time,
  ``RECOMPUTE`` (both bit-exact to never-saw) or ``REROPE`` (approximate)
  (``kernel/kv/eviction.py``);
- ``replay`` is the one ledger replay: a rebuild from the durable ledger, the exact rebuild
  a forget ends with and the "never saw" fingerprint all prefill the same recorded chunks
  with it (``replay_into``, below); the state every module works on is ``kernel/kv/state.py``.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import TypedDict, Unpack

from fak.kernel.kv import eviction, generation, prefill
from fak.kernel.kv.eviction import EvictionError, EvictionReport, EvictMode
from fak.kernel.kv.ledger import LedgerError, Segment, SegmentKind, SegmentState
from fak.kernel.kv.pic_serve import PicBinding
from fak.kernel.kv.prefix_cache import PrefixBinding
from fak.kernel.kv.state import DEFAULT_CHUNK, OnEvent, SessionState
from fak.kernel.model.generate import SamplingParams
from fak.kernel.model.llama import Llama
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.types import VerdictKind

__all__ = [
    "DEFAULT_CHUNK",
    "EvictMode",
    "EvictionError",
    "EvictionReport",
    "OnEvent",
    "PrefixBinding",
    "Session",
    "SessionOptions",
    "replay",
]


class Session(SessionState):
    """A session's verbs over its state (``SessionState``); each verb's mechanism is the module
    the module docstring names."""

    # --- appending -----------------------------------------------------------
    def append(
        self,
        kind: SegmentKind | str,
        text: str | None = None,
        *,
        tokens: Sequence[int] | None = None,
        ref: str | None = None,
        verdict: VerdictKind | str | None = None,
        rule: str | None = None,
        chunks: Sequence[int] | None = None,
        message: dict[str, str] | None = None,
        content: Iterable[str] = (),
        policy_digest: str | None = None,
        segment_id: str | None = None,
        regions: Sequence[int] = (),
        role: str | None = None,
    ) -> Segment:
        """Append a segment: ``text`` is rendered as a chat message of role ``kind``
        (content encoded with special-token strings taken literally); ``tokens`` are
        used as they are (with ``message``, the chat message they render, so later
        turns see it in their history). ``chunks`` overrides the prefill chunking;
        ``content`` adds content provenance beyond the segment's own ref. ``regions``:
        token offsets where content the assembler knows (a document, a schema) begins,
        so PIC cuts identical content identically wherever it lands. ``role``: the chat role
        ``text`` is rendered as, when not the kind's (a tools block the template shows as a
        system turn)."""
        kind = SegmentKind(kind)
        if text is not None and tokens is None:
            message = {"role": role or kind.value, "content": text}
            ids = self._render_message(message)
        elif tokens is not None and text is None:
            ids = [int(t) for t in tokens]
        else:
            raise LedgerError("give exactly one of text or tokens")
        if not ids:
            raise LedgerError("a segment needs at least one token")
        plan = prefill.plan(self, ids, chunks, regions)
        seg = Segment(
            id=segment_id or self.ledger.new_id(),
            kind=kind,
            tokens=ids,
            chunks=plan,
            ref=ref,
            verdict=VerdictKind(verdict) if verdict is not None else None,
            rule=rule,
            protected=kind in self.protected_kinds,
            content=frozenset(content) | ({ref} if ref else set()),
            policy_digest=policy_digest,
        )
        seg.provenance = self.ledger.provenance_before(len(self.ledger.segments)) | ({ref} if ref else set())
        self.ledger.append(seg)
        try:
            prefill.prefill(self, seg)
        except BaseException:
            # leave the session as it was: no half-prefilled segment in cache or ledger
            self.truncate(seg.start)
            self.ledger.segments.remove(seg)
            self.last_logits = None
            raise
        if message is not None:
            self.messages[seg.id] = message
        self.emit("append", seg)
        return seg

    def record_quarantined(
        self,
        kind: SegmentKind | str,
        *,
        ref: str | None,
        verdict: VerdictKind | str,
        rule: str | None,
        policy_digest: str | None = None,
        segment_id: str | None = None,
    ) -> Segment:
        """Record a segment the gate kept out: it never enters the cache (== never saw it)."""
        seg = Segment(
            id=segment_id or self.ledger.new_id(),
            policy_digest=policy_digest,
            kind=SegmentKind(kind),
            tokens=[],
            chunks=[],
            ref=ref,
            verdict=VerdictKind(verdict),
            rule=rule,
            state=SegmentState.QUARANTINED,
        )
        self.ledger.append(seg)
        self.emit("quarantine", seg)
        return seg

    def _render_message(self, message: dict[str, str]) -> list[int]:
        if self.tokenizer is None:
            raise LedgerError("text segments need a tokenizer")
        return self.tokenizer.encode_message(self.live_messages(), message)

    # --- generation --------------------------------------------------------------
    def generate(self, params: SamplingParams | None = None, *,
                 ref: str | None = None, keep: bool = True) -> Generator[int, None, None]:  # fmt: skip
        """Generate an assistant turn, yielding token ids; all or nothing
        (``fak.kernel.kv.generation.generate_turn``; ``keep=False``: undone at the end)."""
        return generation.generate_turn(self, params, ref=ref, keep=keep)

    # --- eviction ----------------------------------------------------------------
    def evict(
        self, segment_ids: Sequence[str], mode: EvictMode | str = EvictMode.AUTO, *, force: bool = False
    ) -> EvictionReport:
        """Evict live segments (one is a list of one) in one step: write-time and RECOMPUTE cut
        the cache once at the earliest and replay the survivors after it once (bit-exact to a
        session that never saw any of them); REROPE cuts each span and re-rotates the survivors
        (approximate). ``AUTO``: write-time when nothing live follows, else RECOMPUTE."""
        return eviction.evict(self, segment_ids, mode, force=force)

    def evict_rows(self, start: int, end: int, mode: EvictMode | str = EvictMode.AUTO) -> EvictionReport:
        """Evict by row range; the range must be exactly one live segment."""
        return self.evict([self.ledger.at_rows(start, end).id], mode)

    def replay_fingerprint(self, segments: Sequence[Segment] | None = None) -> str:
        """Fingerprint of an independent replay of the live ledger: a fresh cache, no
        prefix cache, the same tokens and prefill chunks (what 'never saw' means).
        ``segments``: replay these instead (the survivors as they were at an earlier moment)."""
        live = self.ledger.live() if segments is None else segments
        return replay(self.model, live, tokenizer=self.tokenizer, chunk_size=self.chunk_size,
                      tenant=self.tenant).fingerprint()

    def fork(self, session_id: str | None = None, *, private: bool = False) -> Session:
        """An independent copy (cache, ledger, messages) that shares the model. ``private``: a
        scratch copy that tells the owner nothing (no events) and neither reads nor drops the
        shared KV (no prefix cache, no PIC registry)."""
        other = Session.__new__(Session)
        other.__dict__ |= self.__dict__ | ({"_on_event": None, "prefix": None, "pic": None} if private else {})
        other.id = session_id or "sess_" + uuid.uuid4().hex[:16]
        other.cache = self.cache.clone()
        other.ledger = copy.deepcopy(self.ledger)
        other.messages = dict(self.messages)
        return other



class SessionOptions(TypedDict, total=False):
    """What a ``Session`` is built with besides its model (its constructor's keywords)."""

    tokenizer: ChatTokenizer | None
    session_id: str | None
    tenant: str
    chunk_size: int
    protected_kinds: Sequence[SegmentKind | str]
    on_event: OnEvent | None
    prefix: PrefixBinding | None
    pic: PicBinding | None


def replay(
    model: Llama,
    segments: Iterable[Segment],
    *,
    messages: Mapping[str, dict[str, str]] | None = None,
    **options: Unpack[SessionOptions],
) -> Session:
    """The one ledger replay (a rebuild after a restart or a rollback, the exact rebuild a
    forget or quarantine ends with, the 'never saw' fingerprint): a new ``Session`` built with
    ``options`` in which every live segment of ``segments``, in order, is prefilled from its
    tokens in its recorded chunks (``replay_into``, which says what each segment keeps)."""
    return replay_into(Session(model, **options), segments, messages)


def replay_into(s: Session, segments: Iterable[Segment], messages: Mapping[str, dict[str, str]] | None = None
                ) -> Session:  # fmt: skip
    """Prefill every live segment of ``segments``, in order, into the fresh session ``s`` from
    its tokens in its recorded chunks, so the KV is the bytes the recorded calls computed. PIC
    is off while it runs (nothing served from chunks computed elsewhere) and bound after; a
    bound prefix cache serves only whole recorded calls (the same bytes). Each segment keeps
    its id, ref, verdict, content, protection and expiry, and gets its ``messages`` entry;
    attention provenance is derived again. Segments that are not live are kept as ledger
    records (the objects themselves). Returns ``s``."""
    pic, s.pic = s.pic, None
    for seg in segments:
        if not seg.live:
            s.ledger.append(seg)
            continue
        again = s.append(seg.kind, tokens=seg.tokens, chunks=seg.chunks, ref=seg.ref, verdict=seg.verdict,
                         rule=seg.rule, content=seg.content, policy_digest=seg.policy_digest, segment_id=seg.id,
                         message=messages.get(seg.id) if messages else None)
        again.protected, again.expires_turn = seg.protected, seg.expires_turn
        again.tool, again.source, again.media_type = seg.tool, seg.source, seg.media_type
    s.pic = pic
    return s
