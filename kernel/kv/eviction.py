"""Evict live segments from a session in one step, in one of three modes:

- write-time (the segments end at the tail): truncate. Bit-exact to never-saw.
- ``RECOMPUTE``: truncate at the earliest segment and replay every later live segment
  from its tokens with its recorded chunks. Bit-exact to never-saw; costs the suffix only.
- ``REROPE``: cut the rows and re-rotate the survivors' keys from ``Kraw`` at their new
  positions. Exact at layer 0 only (deeper layers keep what the survivors attended to),
  so it is reported as approximate and the survivors keep the evicted ref in their
  provenance.

Whatever the mode, the shared KV (prefix cache, PIC) that attended to an evicted ref is
dropped: nobody may be served it again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from fak.kernel.kv.ledger import LedgerError, Segment, SegmentState
from fak.kernel.kv.prefill import prefill
from fak.kernel.kv.shared import drop_bound
from fak.kernel.kv.state import SessionState
from fak.kernel.model import rope


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


def evict(s: SessionState, segment_ids: Sequence[str], mode: EvictMode | str = EvictMode.AUTO, *,
          force: bool = False) -> EvictionReport:  # fmt: skip
    """Evict live segments (one is a list of one) in one step: write-time and RECOMPUTE cut
    the cache once at the earliest and replay the survivors after it once (bit-exact to a
    session that never saw any of them); REROPE cuts each span and re-rotates the survivors
    (approximate). ``AUTO``: write-time when nothing live follows, else RECOMPUTE."""
    if isinstance(segment_ids, str):
        raise TypeError("evict takes a sequence of segment ids: a single one is a list of one")
    segs = [s.ledger.get(i) for i in dict.fromkeys(segment_ids)]
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
    later = [x for x in s.ledger.later_live(first) if id(x) not in gone]
    if mode is EvictMode.AUTO:
        mode = EvictMode.RECOMPUTE if later else EvictMode.WRITE_TIME
    if mode is EvictMode.WRITE_TIME and later:
        raise EvictionError(f"segment {first.id} is not the tail; use recompute or rerope")
    replayed = 0
    if mode is EvictMode.REROPE:
        for seg in sorted(segs, key=lambda x: x.start, reverse=True):  # later cuts keep earlier starts
            rerope_remove(s, seg)
        s.reroped = True
    else:
        s.truncate(first.start)
    for seg in segs:
        seg.mark(SegmentState.EVICTED)
        s.messages.pop(seg.id, None)
    s.ledger.renumber()
    if mode is not EvictMode.REROPE:
        for x in later:
            x.provenance = s.ledger.provenance_before(s.ledger.index(x)) | ({x.ref} if x.ref else set())
            prefill(s, x, pic=False)
            replayed += x.length
        if not later:
            s.last_logits = None
    # nobody may be served KV that attended to an evicted span
    dropped = drop_bound(s.prefix, s.pic, sorted({x.ref for x in segs if x.ref}))
    report = EvictionReport(
        segment_id=",".join(x.id for x in segs),
        ref=first.ref if len(segs) == 1 else None,
        mode=mode,
        # an exact replay; rows PIC served before the span (and REROPE) stay approximate
        exactness="approximate" if s.approximate else "bit-exact",
        rows_removed=sum(x.length for x in segs),
        rows_replayed=replayed,
        seconds=time.perf_counter() - t0,
        fingerprint=s.cache.fingerprint(),
        prefix_nodes_dropped=dropped.prefix_nodes,
        pic_chunks_dropped=dropped.pic_chunks,
    )
    for seg in segs:
        s.emit("evict", seg, report=report)
    return report


def rerope_remove(s: SessionState, seg: Segment) -> None:
    """Cut ``seg``'s rows and re-rotate the keys after them from ``Kraw`` at their new positions."""
    cache = s.cache
    start = seg.start
    cache.delete_rows(start, seg.end)
    n = cache.length
    if n > start:
        new_pos = torch.arange(start, n, dtype=torch.int64, device=cache.device)
        cos, sin = rope.cos_sin(s.model.inv_freq, new_pos, cache.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over kv heads
        for layer in range(cache.cfg.num_layers):
            cache.k[layer, start:n] = rope.apply(cache.kraw[layer, start:n], cos, sin)
        cache.positions[start:n] = new_pos
    # the last logits were computed with the span present; the next append or
    # generation opener computes fresh ones
    s.last_logits = None
