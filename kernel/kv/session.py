"""A session: one conversation's KV cache plus the ledger of what is in it.

``append`` prefills a segment (chat-rendered text or raw tokens) in recorded
chunks; ``evict`` removes any live segments (one is a list of one) in one step:

- write-time (the segment is the tail): truncate. Bit-exact to never-saw.
- ``RECOMPUTE``: truncate at the segment and replay every later live segment
  from its tokens with its recorded chunks. Bit-exact to never-saw; costs the
  suffix only.
- ``REROPE``: cut the rows and re-rotate the survivors' keys from ``Kraw`` at
  their new positions. Exact at layer 0 only (deeper layers keep what the
  survivors attended to), so it is reported as approximate and the survivors
  keep the evicted ref in their provenance.

``replay`` is the one ledger replay: a rebuild from the durable ledger, the exact rebuild a
forget ends with and the "never saw" fingerprint all prefill the same recorded chunks with it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict, Unpack

import torch

from fak.kernel.kv.chunking import chunk_bounds
from fak.kernel.kv.ledger import Ledger, LedgerError, Segment, SegmentKind, SegmentState
from fak.kernel.kv.pic import PicEntry
from fak.kernel.kv.pic_serve import FIRST_CHUNK_POSITIONS, PicBinding, PicServed, place, refresh
from fak.kernel.kv.prefix_cache import PrefixCache
from fak.kernel.kv.prefix_tree import call_keys, concat_rows
from fak.kernel.model import rope
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.llama import Llama
from fak.kernel.model.tokenizer import ChatTokenizer

DEFAULT_CHUNK = 512


@dataclass(frozen=True)
class PrefixBinding:
    """Where a session looks up and inserts shared KV: a prefix cache and the
    namespace derived server-side from the authenticated tenant and model."""

    cache: PrefixCache
    namespace: bytes
    priority: int = 35
    ttl: float | None = None
    insert: bool = True  # False: look up only (a benchmark comparing settings on one state)


class EvictMode(StrEnum):
    AUTO = "auto"  # write-time if the segment is the tail, else RECOMPUTE
    WRITE_TIME = "write_time"
    RECOMPUTE = "recompute"
    REROPE = "rerope"


class EvictionError(LedgerError):
    """The segment cannot be evicted that way (protected, not live, not the tail)."""

    code = "eviction_refused"
    status = 409


@dataclass(frozen=True)
class EvictionReport:
    segment_id: str
    ref: str | None
    mode: EvictMode
    exactness: str  # "bit-exact" or "approximate" (docs/design.md vocabulary)
    rows_removed: int
    rows_replayed: int
    seconds: float
    fingerprint: str
    prefix_nodes_dropped: tuple[str, ...] = ()  # prefix-cache nodes that had attended to the span
    pic_chunks_dropped: tuple[str, ...] = ()  # PIC registry chunks that had attended to the span


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
        on_event: Callable[[str, dict], None] | None = None,
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
        self._messages: dict[str, dict[str, str]] = {}  # segment id → chat message (text segments)
        self._last_logits: torch.Tensor | None = None
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
        verdict: str | None = None,
        rule: str | None = None,
        chunks: Sequence[int] | None = None,
        message: dict[str, str] | None = None,
        content: Sequence[str] = (),
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
        if (text is None) == (tokens is None):
            raise LedgerError("give exactly one of text or tokens")
        if text is not None:
            message = {"role": kind.value, "content": text}
            ids = self._render_message(message)
        else:
            ids = [int(t) for t in tokens]  # type: ignore[union-attr]
        if not ids:
            raise LedgerError("a segment needs at least one token")
        if chunks is not None:
            plan = list(chunks)
        elif self.pic is not None:
            vocab = self.model.cfg.vocab_size
            plan = [b - a for a, b in chunk_bounds(ids, regions, self.pic.chunking, vocab)]
        else:
            plan = _chunk(len(ids), self.chunk_size)
        if sum(plan) != len(ids) or any(c < 1 for c in plan):
            raise LedgerError(f"chunks {plan} do not cover {len(ids)} tokens")
        seg = Segment(
            id=segment_id or self.ledger.new_id(),
            kind=kind,
            tokens=ids,
            chunks=plan,
            ref=ref,
            verdict=verdict,
            rule=rule,
            protected=kind in self.protected_kinds,
            content=frozenset(content) | ({ref} if ref else set()),
            policy_digest=policy_digest,
        )
        seg.provenance = self._provenance_before(len(self.ledger.segments)) | ({ref} if ref else set())
        self.ledger.append(seg)
        try:
            self._prefill(seg)
        except BaseException:
            # leave the session as it was: no half-prefilled segment in cache or ledger
            self._truncate(seg.start)
            self.ledger.segments.remove(seg)
            self._last_logits = None
            raise
        if message is not None:
            self._messages[seg.id] = message
        self._emit("append", seg)
        return seg

    def record_quarantined(
        self,
        kind: SegmentKind | str,
        *,
        ref: str | None,
        verdict: str,
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
            verdict=verdict,
            rule=rule,
            state=SegmentState.QUARANTINED,
        )
        self.ledger.append(seg)
        self._emit("quarantine", seg)
        return seg

    def _truncate(self, length: int) -> None:
        """Cut the cache at ``length`` rows; PIC rows cut with it no longer make it approximate."""
        self.cache.truncate(length)
        if self.pic_row is not None and self.pic_row >= length:
            self.pic_row = None

    def _render_message(self, message: dict[str, str]) -> list[int]:
        if self.tokenizer is None:
            raise LedgerError("text segments need a tokenizer")
        history = [self._messages[s.id] for s in self.ledger.live() if s.id in self._messages]
        return self.tokenizer.encode_message(history, message)

    def _prefill(self, seg: Segment, pic: bool = True) -> None:
        """Prefill a segment's chunks, serving leading chunks from the prefix
        cache when it holds them (only whole chunks, so the rows are the bytes
        the same calls would compute), then later chunks from the PIC registry
        when bound (``pic=False``: an exact replay), then insert the segment back."""
        offset = self._serve_from_prefix(seg)
        if offset:
            self._last_logits = None
        self.last_pic = []
        use_pic = pic and self.pic is not None
        run: list[tuple[PicEntry, int, int]] = []  # chunks placed back to back: (entry, row, position)
        boundary = 0
        for n in seg.chunks:
            a, boundary = boundary, boundary + n
            if a < offset:
                continue
            tokens = seg.tokens[a:boundary]
            entry = self._pic_lookup(tokens) if use_pic else None
            if entry is not None:
                run.append((entry, self.cache.length, self.cache.next_position()))
                place(self.model, self.cache, entry, naive=self.pic.naive)
                continue
            self._finish_run(seg, run)
            run = []
            position, row = self.cache.next_position(), self.cache.length
            self._last_logits = self.model.forward(tokens, self.cache)
            if use_pic and self.pic.insert and position >= FIRST_CHUNK_POSITIONS:
                # a chunk computed near position 0 holds the attention sink: not reusable elsewhere
                self.pic.registry.put(self.pic.namespace, tokens, self.cache.kraw[:, row : row + n],
                                      self.cache.v[:, row : row + n], position, seg.provenance)
        self._finish_run(seg, run)
        self._insert_prefix()

    def _pic_lookup(self, tokens: list[int]) -> PicEntry | None:
        """The registry's chunk for these tokens, never for the first chunk of the sequence."""
        assert self.pic is not None
        if self.cache.next_position() < FIRST_CHUNK_POSITIONS:
            return None
        return self.pic.registry.get(self.pic.namespace, tokens)

    def _finish_run(self, seg: Segment, run: list[tuple[PicEntry, int, int]]) -> None:
        """Recompute what the binding asks of a run of placed chunks and account for it. The
        rows attended to the context they were computed in, so the segment inherits their
        provenance and the session is approximate from the run's first row."""
        if not run:
            return
        assert self.pic is not None
        start = run[0][1]
        spans = [(row - start, row - start + len(e)) for e, row, _ in run]
        recomputed = [0] * len(run)
        if self.pic.recompute_first or self.pic.blend_fraction:
            recomputed = refresh(self.model, self.cache, start, spans, self.pic)
        if self.pic_row is None:
            self.pic_row = start
        for (entry, row, position), again in zip(run, recomputed, strict=True):
            got = PicServed(entry.id, row, len(entry), entry.source_position, position, again)
            seg.provenance = seg.provenance | entry.provenance
            self.pic_hit_tokens += got.tokens - got.recomputed
            self.last_pic.append(got)
            self._emit("pic_hit", seg, chunk=got.as_dict())
        self._last_logits = None  # the next forward call computes fresh logits

    def _call_starts(self, extra: Segment | None = None) -> list[int]:
        """Absolute positions where the forward calls that computed the live rows began
        (and those ``extra``, about to be prefilled at the end, will begin)."""
        starts: list[int] = []
        segs = [s for s in self.ledger.live() if s.end <= self.cache.length or s is extra]
        if extra is not None and extra not in segs:
            segs.append(extra)
        for s in segs:
            pos = s.start if s is not extra else self.cache.length
            for n in s.chunks:
                starts.append(pos)
                pos += n
        return starts

    def _serve_from_prefix(self, seg: Segment) -> int:
        """Serve whole leading chunks of ``seg`` from the prefix cache, but only rows the
        same calls computed: the tree is keyed by tokens and call boundaries (a chunk end
        inside the match is a call end of the producer too)."""
        if self.prefix is None or self.approximate:
            return 0
        start = self.cache.length
        wanted = call_keys(self.cache.token_list() + seg.tokens, self._call_starts(extra=seg))
        with self.prefix.cache.match(self.prefix.namespace, wanted) as m:
            served = 0
            boundary = 0
            for n in seg.chunks:
                end = start + boundary + n
                if end > m.length:
                    break
                boundary += n
                served = boundary
            if served == 0:
                return 0
            self.cache.extend(concat_rows(m.blocks(), start, start + served))
        self.prefix_hit_tokens += served
        self._emit("prefix_hit", seg, tokens=served)
        return served

    def _insert_prefix(self) -> None:
        """Insert the exact rows (all of them, or those before the first PIC row)."""
        exact = self.exact_rows
        if self.prefix is None or not self.prefix.insert or exact == 0:
            return
        spans = [
            (s.start, min(s.end, exact), r)
            for s in self.ledger.live()
            if s.start < exact and s.end <= self.cache.length and s.length
            for r in sorted(s.content | ({s.ref} if s.ref else set()))
        ]
        keys = call_keys(self.cache.token_list(), self._call_starts())[:exact]
        self.prefix.cache.insert(
            self.prefix.namespace,
            keys,
            self.cache,
            provenance=spans,
            priority=self.prefix.priority,
            ttl=self.prefix.ttl,
        )

    def _provenance_before(self, index: int) -> frozenset[str]:
        refs: set[str] = set()
        for s in self.ledger.segments[:index]:
            if s.live:
                refs |= s.provenance
        return frozenset(refs)

    # --- generation --------------------------------------------------------------
    def generate(self, params: SamplingParams | None = None, *, ref: str | None = None) -> Iterator[int]:
        """Generate an assistant turn; yields token ids as they come. When the
        iterator is exhausted the turn is a closed assistant segment in the ledger
        whose content provenance is every ref live while it was produced.

        All or nothing: a consumer that stops early (closes the iterator, drops
        it, or a client that disconnects) or an error mid-way leaves cache and
        ledger exactly as they were before the call."""
        if self.tokenizer is None:
            raise LedgerError("generate needs a tokenizer")
        tok = self.tokenizer
        # default: the model's own end-of-turn tokens; a caller's params are used as given
        params = params or SamplingParams(stop_token_ids=frozenset(tok.stop_token_ids))
        history = [self._messages[s.id] for s in self.ledger.live() if s.id in self._messages]
        opener = tok.generation_prompt(history)
        start, logits_before = self.cache.length, self._last_logits
        done = False
        try:
            chunks = [len(opener)]
            logits = self.model.forward(opener, self.cache)
            produced: list[int] = []
            for t in generate(self.model, self.cache, None, params, logits=logits):
                produced.append(t)
                yield t
            if not produced:
                return
            # every token but the last was appended one at a time by the decode loop
            chunks += [1] * (len(produced) - 1)
            closing = tok.close_turn(produced[-1])
            last = self.model.forward(closing, self.cache)
            chunks.append(len(closing))
            ids = opener + produced[:-1] + closing
            live = self.ledger.live()
            seg = Segment(
                id=self.ledger.new_id(),
                kind=SegmentKind.ASSISTANT,
                tokens=ids,
                chunks=chunks,
                ref=ref,
                protected=SegmentKind.ASSISTANT in self.protected_kinds,
                content=frozenset().union(*(s.provenance | s.content for s in live)) | ({ref} if ref else set()),
            )
            seg.provenance = self._provenance_before(len(self.ledger.segments)) | ({ref} if ref else set())
            self.ledger.append(seg)
            text = tok.decode([t for t in produced if t not in tok.stop_token_ids])
            self._messages[seg.id] = {"role": "assistant", "content": text}
            self._last_logits = last
            done = True
            self._insert_prefix()
            self._emit("append", seg)
        finally:
            if not done:
                self.cache.truncate(start)
                self._last_logits = logits_before

    @property
    def last_logits(self) -> torch.Tensor | None:
        """Logits after the latest forward call (None after an eviction that ended at the tail)."""
        return self._last_logits

    # --- eviction ----------------------------------------------------------------
    def evict(
        self, segment_ids: Sequence[str], mode: EvictMode | str = EvictMode.AUTO, *, force: bool = False
    ) -> EvictionReport:
        """Evict live segments (one is a list of one) in one step: write-time and RECOMPUTE cut
        the cache once at the earliest and replay the survivors after it once (bit-exact to a
        session that never saw any of them); REROPE cuts each span and re-rotates the survivors
        (approximate). ``AUTO``: write-time when nothing live follows, else RECOMPUTE."""
        if isinstance(segment_ids, str):
            raise TypeError("evict takes a sequence of segment ids: a single one is a list of one")
        segs = [self.ledger.get(i) for i in dict.fromkeys(segment_ids)]
        if not segs:
            raise EvictionError("no segment to evict")
        mode = EvictMode(mode)
        for seg in segs:
            if not seg.live:
                raise EvictionError(f"segment {seg.id} is already {seg.state.value}")
            if seg.protected and not force:
                raise EvictionError(f"segment {seg.id} ({seg.kind.value}) is protected from eviction")
        t0 = time.perf_counter()
        first = min(segs, key=lambda x: x.start)
        gone = {id(x) for x in segs}
        later = [x for x in self.ledger.later_live(first) if id(x) not in gone]
        if mode is EvictMode.AUTO:
            mode = EvictMode.RECOMPUTE if later else EvictMode.WRITE_TIME
        if mode is EvictMode.WRITE_TIME and later:
            raise EvictionError(f"segment {first.id} is not the tail; use recompute or rerope")
        replayed = 0
        if mode is EvictMode.REROPE:
            for seg in sorted(segs, key=lambda x: x.start, reverse=True):  # later cuts keep earlier starts
                self._rerope_remove(seg)
            self.reroped = True
        else:
            self._truncate(first.start)
        for seg in segs:
            seg.mark(SegmentState.EVICTED)
            self._messages.pop(seg.id, None)
        self.ledger.renumber()
        if mode is not EvictMode.REROPE:
            for x in later:
                x.provenance = self._provenance_before(self.ledger.index(x)) | ({x.ref} if x.ref else set())
                self._prefill(x, pic=False)
                replayed += x.length
            if not later:
                self._last_logits = None
        # nobody may be served KV that attended to an evicted span
        dropped, chunks = self._drop_shared(sorted({x.ref for x in segs if x.ref}))
        report = EvictionReport(
            segment_id=",".join(x.id for x in segs),
            ref=first.ref if len(segs) == 1 else None,
            mode=mode,
            # an exact replay; rows PIC served before the span (and REROPE) stay approximate
            exactness="approximate" if self.approximate else "bit-exact",
            rows_removed=sum(x.length for x in segs),
            rows_replayed=replayed,
            seconds=time.perf_counter() - t0,
            fingerprint=self.cache.fingerprint(),
            prefix_nodes_dropped=tuple(dropped),
            pic_chunks_dropped=tuple(chunks),
        )
        for seg in segs:
            self._emit("evict", seg, report=report)
        return report

    def _drop_shared(self, refs: Sequence[str]) -> tuple[list[str], list[str]]:
        """Drop the prefix-cache nodes and PIC chunks of this namespace that attended to ``refs``."""
        nodes: list[str] = []
        chunks: list[str] = []
        for ref in refs:
            if self.prefix is not None:
                nodes += self.prefix.cache.drop_ref(self.prefix.namespace, ref)
            if self.pic is not None:
                chunks += self.pic.registry.drop_ref(self.pic.namespace, ref)
        return nodes, chunks

    def replay_fingerprint(self, segments: Sequence[Segment] | None = None) -> str:
        """Fingerprint of an independent replay of the live ledger: a fresh cache, no
        prefix cache, the same tokens and prefill chunks (what 'never saw' means).
        ``segments``: replay these instead (the survivors as they were at an earlier moment)."""
        live = self.ledger.live() if segments is None else segments
        return replay(self.model, live, tokenizer=self.tokenizer, chunk_size=self.chunk_size,
                      tenant=self.tenant).fingerprint()

    def evict_rows(self, start: int, end: int, mode: EvictMode | str = EvictMode.AUTO) -> EvictionReport:
        """Evict by row range; the range must be exactly one live segment."""
        return self.evict([self.ledger.at_rows(start, end).id], mode)

    def _rerope_remove(self, seg: Segment) -> None:
        cache = self.cache
        start = seg.start
        cache.delete_rows(start, seg.end)
        n = cache.length
        if n > start:
            new_pos = torch.arange(start, n, dtype=torch.int64, device=cache.device)
            cos, sin = rope.cos_sin(self.model.inv_freq, new_pos, cache.dtype)
            cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over kv heads
            for layer in range(cache.cfg.num_layers):
                cache.k[layer, start:n] = rope.apply(cache.kraw[layer, start:n], cos, sin)
            cache.positions[start:n] = new_pos
        # the last logits were computed with the span present; the next append or
        # generation opener computes fresh ones
        self._last_logits = None

    def fork(self, session_id: str | None = None) -> Session:
        """An independent copy (cache, ledger, messages) that shares the model."""
        import copy

        other = Session.__new__(Session)
        other.__dict__ |= self.__dict__
        other.id = session_id or "sess_" + uuid.uuid4().hex[:16]
        other.cache = self.cache.clone()
        other.ledger = copy.deepcopy(self.ledger)
        other._messages = dict(self._messages)  # noqa: SLF001  (same class: the copy gets its own dict)
        return other

    def message(self, segment_id: str) -> dict[str, str] | None:
        """The chat message a text segment was appended with (a rebuild or persist carries it)."""
        return self._messages.get(segment_id)

    def live_messages(self) -> list[dict[str, str]]:
        """The chat messages of the live segments in order: the history a new message is encoded after."""
        return [self._messages[s.id] for s in self.ledger.live() if s.id in self._messages]

    def drop_logits(self) -> None:
        """Forget the last logits after an edit of the cache made outside this class (the next
        forward computes fresh ones)."""
        self._last_logits = None

    # --- identity ----------------------------------------------------------------
    def fingerprint(self) -> str:
        return self.cache.fingerprint()

    def refs(self) -> set[str]:
        """Every ref that influenced the live KV."""
        out: set[str] = set()
        for s in self.ledger.live():
            out |= s.provenance
        return out

    def _emit(self, what: str, seg: Segment, **extra: object) -> None:
        if self._on_event:
            self._on_event(what, {"session": self.id, "tenant": self.tenant, "segment": seg.summary(), **extra})


class SessionOptions(TypedDict, total=False):
    """What a ``Session`` is built with besides its model (its constructor's keywords)."""

    tokenizer: ChatTokenizer | None
    session_id: str | None
    tenant: str
    chunk_size: int
    protected_kinds: Sequence[SegmentKind | str]
    on_event: Callable[[str, dict], None] | None
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
    tokens in its recorded chunks, so the KV is the bytes the recorded calls computed. PIC is
    off while it runs (nothing served from chunks computed elsewhere) and bound after; a bound
    prefix cache serves only whole recorded calls (the same bytes). Each segment keeps its id,
    ref, verdict, content, protection and expiry, and gets its ``messages`` entry; attention
    provenance is derived again. Segments that are not live are kept as ledger records (the
    objects themselves)."""
    s = Session(model, **options)
    pic, s.pic = s.pic, None
    for seg in segments:
        if not seg.live:
            s.ledger.append(seg)
            continue
        copy = s.append(seg.kind, tokens=seg.tokens, chunks=seg.chunks, ref=seg.ref, verdict=seg.verdict,
                        rule=seg.rule, content=seg.content, policy_digest=seg.policy_digest, segment_id=seg.id,
                        message=messages.get(seg.id) if messages else None)
        copy.protected, copy.expires_turn = seg.protected, seg.expires_turn
    s.pic = pic
    return s


def _chunk(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]
