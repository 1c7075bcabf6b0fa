"""Prefill a segment into a session's cache: plan its chunks, serve whole leading chunks from
the prefix cache (exact: the rows the same calls compute; when another session of the
namespace is computing the next of those calls now, wait for it and be served:
``prefix_flight``), then chunks the PIC registry holds (approximate, only when bound), compute
the rest one forward call per chunk, and insert the exact rows back into the prefix cache.

The chunk plan is the segment's record: a replay makes the same calls, so its KV is the same
bytes (``kernel/kv/session.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import accumulate

from fak.kernel.kv.chunking import chunk_bounds
from fak.kernel.kv.ledger import LedgerError, Segment
from fak.kernel.kv.pic import PicEntry
from fak.kernel.kv.pic_serve import FIRST_CHUNK_POSITIONS, PicBinding, PicServed, place, refresh
from fak.kernel.kv.prefix_cache import PrefixMatch
from fak.kernel.kv.prefix_flight import WAIT_S, Claim, Flight, flight_key
from fak.kernel.kv.prefix_tree import call_keys, concat_rows
from fak.kernel.kv.state import SessionState

# chunks placed back to back from the PIC registry: (entry, row, position)
_Run = list[tuple[PicEntry, int, int]]


def plan(s: SessionState, ids: Sequence[int], chunks: Sequence[int] | None, regions: Sequence[int]) -> list[int]:
    """The prefill call sizes of a new segment of tokens ``ids``: ``chunks`` when given, else
    content-defined chunks when PIC is bound (identical content cut identically wherever it
    lands, ``regions`` marking where known content begins), else the session's fixed size."""
    out = list(chunks) if chunks is not None else default_chunks(ids, s.chunk_size, s.pic, s.model.cfg.vocab_size, regions)
    if sum(out) != len(ids) or any(c < 1 for c in out):
        raise LedgerError(f"chunks {out} do not cover {len(ids)} tokens")
    return out


def default_chunks(ids: Sequence[int], chunk_size: int, pic: PicBinding | None, vocab: int,
                   regions: Sequence[int] = ()) -> list[int]:
    """The call sizes a segment of ``ids`` gets unless its caller gives them: content-defined
    chunks when PIC is bound, else the session's fixed size."""
    if pic is not None:
        return [b - a for a, b in chunk_bounds(ids, regions, pic.chunking, vocab)]
    return fixed_chunks(len(ids), chunk_size)


def fixed_chunks(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def prefill(s: SessionState, seg: Segment, pic: bool = True) -> None:
    """Prefill a segment's chunks, serving leading chunks from the prefix
    cache when it holds them (only whole chunks, so the rows are the bytes
    the same calls would compute; waiting for them when another session of the
    namespace is computing the same calls now), then later chunks from the PIC registry
    when bound (``pic=False``: an exact replay), then insert the segment back."""
    offset, claim = serve_from_prefix(s, seg)
    try:
        _compute(s, seg, offset, pic)
        insert_prefix(s)
    finally:
        if claim is not None:
            claim.release()


def _compute(s: SessionState, seg: Segment, offset: int, pic: bool) -> None:
    """The chunks of ``seg`` from row ``offset`` on: placed from the PIC registry or computed."""
    if offset:
        s.last_logits = None
    s.last_pic = []
    binding = s.pic if pic else None
    run: _Run = []
    boundary = computed = 0
    try:
        for n in seg.chunks:
            a, boundary = boundary, boundary + n
            if a < offset:
                continue
            tokens = seg.tokens[a:boundary]
            entry = _pic_lookup(s, binding, tokens) if binding is not None else None
            if entry is not None and binding is not None:
                run.append((entry, s.cache.length, s.cache.next_position()))
                place(s.model, s.cache, entry, naive=binding.naive)
                continue
            _finish_run(s, seg, run)
            run = []
            position, row = s.cache.next_position(), s.cache.length
            s.last_logits = s.model.forward(tokens, s.cache)
            computed += n
            if binding is not None and binding.insert and position >= FIRST_CHUNK_POSITIONS:
                # a chunk computed near position 0 holds the attention sink: not reusable elsewhere
                binding.registry.put(binding.namespace, tokens, s.cache.kraw[:, row : row + n],
                                     s.cache.v[:, row : row + n], position, seg.provenance)
        _finish_run(s, seg, run)
    finally:
        if s.prefix is not None and computed:
            s.prefix.cache.account(s.prefix.namespace, computed=computed)


def _pic_lookup(s: SessionState, binding: PicBinding, tokens: list[int]) -> PicEntry | None:
    """The registry's chunk for these tokens, never for the first chunk of the sequence, and
    never for Gemma 3 (PIC re-rotates keys with one RoPE base and estimates deviation with the
    Llama layer; Gemma's local layers have another base and its layer is another computation:
    its chunks are computed, exactly, as without PIC)."""
    if s.cache.next_position() < FIRST_CHUNK_POSITIONS or s.model.cfg.gemma:
        return None
    return binding.registry.get(binding.namespace, tokens)


def _finish_run(s: SessionState, seg: Segment, run: _Run) -> None:
    """Recompute what the binding asks of a run of placed chunks and account for it. The
    rows attended to the context they were computed in, so the segment inherits their
    provenance and the session is approximate from the run's first row."""
    if not run:
        return
    binding = s.pic
    assert binding is not None  # a run is only placed while PIC is bound
    start = run[0][1]
    spans = [(row - start, row - start + len(e)) for e, row, _ in run]
    recomputed = [0] * len(run)
    if binding.recompute_first or binding.blend_fraction:
        recomputed = refresh(s.model, s.cache, start, spans, binding)
    if s.pic_row is None:
        s.pic_row = start
    for (entry, row, position), again in zip(run, recomputed, strict=True):
        got = PicServed(entry.id, row, len(entry), entry.source_position, position, again)
        seg.provenance = seg.provenance | entry.provenance
        s.pic_hit_tokens += got.tokens - got.recomputed
        s.last_pic.append(got)
        s.emit("pic_hit", seg, chunk=got.as_dict())
    s.last_logits = None  # the next forward call computes fresh logits


def call_starts(s: SessionState, extra: Segment | None = None) -> list[int]:
    """Absolute positions where the forward calls that computed the live rows began
    (and those ``extra``, about to be prefilled at the end, will begin)."""
    starts: list[int] = []
    segs = [x for x in s.ledger.live() if x.end <= s.cache.length or x is extra]
    if extra is not None and extra not in segs:
        segs.append(extra)
    for x in segs:
        pos = x.start if x is not extra else s.cache.length
        for n in x.chunks:
            starts.append(pos)
            pos += n
    return starts


def serve_from_prefix(s: SessionState, seg: Segment) -> tuple[int, Claim | None]:
    """Serve whole leading chunks of ``seg`` from the prefix cache, but only rows the
    same calls computed: the tree is keyed by tokens and call boundaries (a chunk end
    inside the match is a call end of the producer too). Returns the rows served and, when
    the session inserts what it computes, its claim on the calls it is to compute
    (``prefix_flight``: release it when the segment is in the cache or failed). When another
    session of the namespace is computing the next call now, it waits for that one to
    finish and looks up again (``WAIT_S`` at most)."""
    if s.prefix is None or s.approximate:
        return 0, None
    cache, ns = s.prefix.cache, s.prefix.namespace
    start = s.cache.length
    wanted = call_keys(s.cache.token_list() + seg.tokens, call_starts(s, extra=seg))
    ends = list(accumulate(seg.chunks, initial=start))[1:]
    deadline = time.monotonic() + WAIT_S
    waits = 0
    m = cache.match(ns, wanted)
    while True:
        todo = [e for e in ends if e > m.length]
        got: Flight | Claim | None = None
        if todo and time.monotonic() < deadline:
            got = cache.flights.take(ns, [flight_key(wanted[:e]) for e in todo], claim=s.prefix.insert)
        if isinstance(got, Claim):  # a claim released between the lookup and the take inserted its rows first
            m = _longer(m, lambda: cache.match(ns, wanted, count=False), got)
            todo = [e for e in ends if e > m.length]
        if not isinstance(got, Flight):
            break
        m.release()  # another session computes the next call: wait for it, then look up again
        waits += 1
        got.wait(deadline - time.monotonic())
        m = cache.match(ns, wanted, count=False)
    claim = got if isinstance(got, Claim) else None
    try:
        with m:
            served = ends[len(ends) - len(todo) - 1] - start if len(todo) < len(ends) else 0
            if served:
                s.cache.extend(concat_rows(m.blocks(), start, start + served))
    except BaseException:
        if claim is not None:
            claim.release()
        raise
    if served or waits:
        cache.account(ns, served=served, waits=waits)
    if served:
        s.prefix_hit_tokens += served
        s.emit("prefix_hit", seg, tokens=served)
    return served, claim


def _longer(m: PrefixMatch, again: Callable[[], PrefixMatch], claim: Claim) -> PrefixMatch:
    """The longer of ``m`` and a second lookup (the other released); ``claim`` is released if
    the second lookup fails."""
    try:
        other = again()
    except BaseException:
        claim.release()
        m.release()
        raise
    keep, drop = (other, m) if other.length > m.length else (m, other)
    drop.release()
    return keep


def insert_prefix(s: SessionState) -> None:
    """Insert the exact rows (all of them, or those before the first PIC row)."""
    exact = s.exact_rows
    if s.prefix is None or not s.prefix.insert or exact == 0:
        return
    spans = [
        (x.start, min(x.end, exact), r)
        for x in s.ledger.live()
        if x.start < exact and x.end <= s.cache.length and x.length
        for r in sorted(x.content | ({x.ref} if x.ref else set()))
    ]
    keys = call_keys(s.cache.token_list(), call_starts(s))[:exact]
    s.prefix.cache.insert(
        s.prefix.namespace,
        keys,
        s.cache,
        provenance=spans,
        priority=s.prefix.priority,
        ttl=s.prefix.ttl,
    )
