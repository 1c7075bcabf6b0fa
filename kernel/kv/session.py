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
  with it (``kernel/kv/replay.py``).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import torch

from fak.kernel.kv import eviction, generation, prefill
from fak.kernel.kv.eviction import EvictionError, EvictionReport, EvictMode
from fak.kernel.kv.ledger import Ledger, LedgerError, Segment, SegmentKind, SegmentState
from fak.kernel.kv.pic_serve import PicBinding, PicServed
from fak.kernel.kv.prefix_cache import PrefixBinding
from fak.kernel.kv.replay import replay_into
from fak.kernel.model.generate import SamplingParams
from fak.kernel.model.llama import Llama
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.types import VerdictKind

DEFAULT_CHUNK = 512

# what a session tells its owner about each change: (what, {"session", "tenant", "segment", ...})
OnEvent = Callable[[str, dict[str, Any]], None]

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


class Session:
    def __init__(
        self,
        model: Llama,
        tokenizer: ChatTokenizer | None = None,
        *,
        session_id: str | None = None,
        tenant: str = "default",
        chunk_size: int = DEFAULT_CHUNK,
        protected_kinds: Sequence[SegmentKind | str] = (SegmentKind.SYSTEM,),
        on_event: OnEvent | None = None,
        prefix: PrefixBinding | None = None,
        pic: PicBinding | None = None,
    ) -> None:
        """``pic``: position-independent reuse (approximate), when the policy allows it.
        Segments are then prefilled in content-defined chunks, and a chunk the registry
        holds is served from it after the exact prefix hit."""
        if chunk_size < 1:
            raise LedgerError("chunk_size must be ≥ 1")
        self.model = model
        self.tokenizer = tokenizer
        self.id = session_id or "sess_" + uuid.uuid4().hex[:16]
        self.tenant = tenant
        self.chunk_size = chunk_size
        self.protected_kinds = {SegmentKind(k) for k in protected_kinds}
        self.cache = model.new_cache()
        self.ledger = Ledger()
        self.messages: dict[str, dict[str, str]] = {}  # segment id → chat message (text segments)
        # logits after the latest forward call (None after an edit that ended at the tail)
        self.last_logits: torch.Tensor | None = None
        self._on_event = on_event
        self.prefix = prefix
        self.pic = pic
        self.reroped = False  # set by REROPE: the KV then differs from any exact run
        self.pic_row: int | None = None  # first cache row served by PIC (rows before it are exact)
        self.prefix_hit_tokens = 0
        self.pic_hit_tokens = 0  # served from the PIC registry (approximate), recomputed rows excluded
        self.last_pic: list[PicServed] = []  # what the latest append served from the registry

    @property
    def approximate(self) -> bool:
        """Whether the KV differs from every exact run of the same calls (REROPE or PIC rows)."""
        return self.reroped or self.pic_row is not None

    @property
    def exact_rows(self) -> int:
        """How many leading rows are the bytes an exact run computes."""
        if self.reroped:
            return 0
        return self.cache.length if self.pic_row is None else self.pic_row

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
    ) -> Segment:
        """Append a segment: ``text`` is rendered as a chat message of role ``kind``
        (content encoded with special-token strings taken literally); ``tokens`` are
        used as they are (with ``message``, the chat message they render, so later
        turns see it in their history). ``chunks`` overrides the prefill chunking;
        ``content`` adds content provenance beyond the segment's own ref. ``regions``:
        token offsets where content the assembler knows (a document, a schema) begins,
        so PIC cuts identical content identically wherever it lands."""
        kind = SegmentKind(kind)
        if text is not None and tokens is None:
            message = {"role": kind.value, "content": text}
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

    def truncate(self, length: int) -> None:
        """Cut the cache at ``length`` rows; PIC rows cut with it no longer make it approximate."""
        self.cache.truncate(length)
        if self.pic_row is not None and self.pic_row >= length:
            self.pic_row = None

    def _render_message(self, message: dict[str, str]) -> list[int]:
        if self.tokenizer is None:
            raise LedgerError("text segments need a tokenizer")
        return self.tokenizer.encode_message(self.live_messages(), message)

    # --- generation --------------------------------------------------------------
    def generate(self, params: SamplingParams | None = None, *,
                 ref: str | None = None) -> Generator[int, None, None]:  # fmt: skip
        """Generate an assistant turn, yielding token ids; all or nothing
        (``fak.kernel.kv.generation.generate_turn``)."""
        return generation.generate_turn(self, params, ref=ref)

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

    def fork(self, session_id: str | None = None) -> Session:
        """An independent copy (cache, ledger, messages) that shares the model."""
        other = Session.__new__(Session)
        other.__dict__ |= self.__dict__
        other.id = session_id or "sess_" + uuid.uuid4().hex[:16]
        other.cache = self.cache.clone()
        other.ledger = copy.deepcopy(self.ledger)
        other.messages = dict(self.messages)
        return other

    def message(self, segment_id: str) -> dict[str, str] | None:
        """The chat message a text segment was appended with (a rebuild or persist carries it)."""
        return self.messages.get(segment_id)

    def live_messages(self) -> list[dict[str, str]]:
        """The chat messages of the live segments in order: the history a new message is encoded after."""
        return [self.messages[s.id] for s in self.ledger.live() if s.id in self.messages]

    def drop_logits(self) -> None:
        """Forget the last logits after an edit of the cache made outside this class (the next
        forward computes fresh ones)."""
        self.last_logits = None

    # --- identity ----------------------------------------------------------------
    def fingerprint(self) -> str:
        return self.cache.fingerprint()

    def refs(self) -> set[str]:
        """Every ref that influenced the live KV."""
        out: set[str] = set()
        for s in self.ledger.live():
            out |= s.provenance
        return out

    def emit(self, what: str, seg: Segment, **extra: object) -> None:
        """Tell the owner (``on_event``) about a change to ``seg``: ids and digests, never content."""
        if self._on_event:
            self._on_event(what, {"session": self.id, "tenant": self.tenant, "segment": seg.summary(), **extra})


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
