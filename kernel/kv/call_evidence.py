"""Evidence about a tool call the model wrote: which refs its arguments attended to, and
what the arguments' log-probabilities are with and without those refs.

Both come from the owned KV, on forks of the session (the session itself is not changed):

- attention: the turn's tokens are teacher-forced once at rows ``base..`` through the eager
  forward with a capture (``Llama.forward(capture=...)``), which sums each layer's attention
  probabilities over each ref's rows; an argument's mass on a ref is that sum averaged over
  heads and the argument's tokens, per layer.
- counterfactual: the refs' live tool segments are evicted by ``RECOMPUTE`` (the cache is
  then the bytes of a session that never saw them) and the same tokens are teacher-forced
  through the same eager path, so the log-probabilities without the refs are those of a
  never-saw session, bit for bit (``teacher_force`` on it gives the same floats). The cost
  is the suffix replay plus the turn's tokens, reported as ``rows_recomputed`` and seconds.

An argument's first token at turn index 0 has no logits in the turn (they would be the
context's last logits, computed by another path), so it is left out of its log-probability
and named in ``CallEvidence.unscored``; a call's arguments follow a prefix in practice.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

from fak.kernel.kv.eviction import EvictMode, evict
from fak.kernel.kv.ledger import LedgerError, SegmentKind
from fak.kernel.kv.session import Session

__all__ = ["CallEvidence", "RefAttention", "RowMass", "arg_logprobs", "call_evidence", "context_fork",
           "teacher_force", "token_ranges"]


@dataclass(frozen=True)
class RefAttention:
    """The attention mass an argument's tokens put on a ref's rows: per layer, the
    probabilities summed over the ref's rows and averaged over heads and the tokens."""

    per_layer: tuple[float, ...]
    mean: float  # averaged over layers
    total: float  # summed over layers


@dataclass(frozen=True)
class CallEvidence:
    attention: dict[str, dict[str, RefAttention]]  # argument name -> ref -> mass
    logprob_with: dict[str, float]  # argument name -> sum of its tokens' log-probs, refs in context
    logprob_without: dict[str, float] | None  # the same with the counterfactual refs evicted (None: not run)
    rows_recomputed: int  # suffix rows the RECOMPUTE replayed
    seconds_attention: float  # fork, teacher-forced forward with the capture, reductions
    seconds_counterfactual: float  # RECOMPUTE eviction, teacher-forced forward, log-probs (0 when not run)
    exactness: str  # the eviction's: "bit-exact" (RECOMPUTE-exact), "approximate" (the session was), "not run"
    evicted_segments: tuple[str, ...] = ()  # the segments the counterfactual evicted
    unscored: tuple[str, ...] = ()  # arguments starting at turn index 0: their first token is left out
    turn_rows: int = 0  # the teacher-forced tokens (each forward's length)


class RowMass:
    """An ``AttentionCapture`` that keeps, per layer and per named row set, the attention
    probabilities summed over the set's rows: ``(heads, T)`` each, not the whole matrix."""

    def __init__(self, rows: Mapping[str, Sequence[tuple[int, int]]]) -> None:
        self.rows = {name: [(int(a), int(b)) for a, b in spans] for name, spans in rows.items()}
        self.sums: dict[str, list[torch.Tensor]] = {name: [] for name in self.rows}

    def layer(self, index: int, probs: torch.Tensor) -> None:
        if index == 0:  # a new forward call: keep only its layers
            self.sums = {name: [] for name in self.rows}
        if not self.rows:
            return
        p = probs[0].to(torch.float32)  # (heads, T, rows)
        for name, spans in self.rows.items():
            total = torch.zeros(p.shape[:2], dtype=torch.float32)
            for a, b in spans:
                if not 0 <= a <= b <= p.shape[-1]:
                    raise LedgerError(f"rows [{a}, {b}) of {name!r} lie outside the {p.shape[-1]} rows attended")
                total += p[..., a:b].sum(-1).cpu()
            self.sums[name].append(total)

    def mass(self, name: str, i: int, j: int) -> RefAttention:
        """The mass tokens ``[i, j)`` of the forward call put on ``name``'s rows."""
        per_layer = tuple(float(t[:, i:j].mean()) if j > i else 0.0 for t in self.sums[name])
        return RefAttention(per_layer, sum(per_layer) / len(per_layer), sum(per_layer))


def context_fork(s: Session, base: int) -> Session:
    """A silent fork of ``s`` holding only the context rows ``[0, base)``: no events to the
    owner, no shared prefix cache or PIC registry (nothing shared is read or dropped), and
    the live segments from ``base`` on (the turn, when it was kept) evicted at the tail."""
    if s.cache.length < base:
        raise LedgerError(f"the session holds {s.cache.length} rows, fewer than the context's {base}")
    f = s.fork(private=True)
    live = f.ledger.live()
    if any(x.start < base < x.end for x in live):
        raise LedgerError(f"row {base} is inside a segment: the context must end at a segment boundary")
    tail = [x.id for x in live if x.start >= base]
    if tail:
        evict(f, tail, EvictMode.WRITE_TIME, force=True)
    f.truncate(base)
    f.drop_logits()
    return f


def teacher_force(s: Session, turn_tokens: Sequence[int], capture: RowMass | None = None) -> torch.Tensor:
    """Logits ``(T, vocab)`` of ``turn_tokens`` forced at the end of ``s``'s cache (their rows are
    appended; use a fork), always through the eager captured path, so every call that sees the
    same cache bytes returns the same floats."""
    return s.model.forward(list(turn_tokens), s.cache, all_logits=True, capture=capture or RowMass({}))


def arg_logprobs(logits: torch.Tensor, turn_tokens: Sequence[int], args: Mapping[str, tuple[int, int]]
                 ) -> dict[str, float]:  # fmt: skip
    """Per argument, the sum of its tokens' log-probabilities (token ``k`` scored by the logits
    at ``k - 1``; a token at index 0 has none and is left out)."""
    logp = torch.log_softmax(logits.to("cpu", torch.float32), dim=-1)  # on the host, where the ids are
    ids = torch.as_tensor(list(turn_tokens), dtype=torch.int64)
    out: dict[str, float] = {}
    for name, (i, j) in args.items():
        if not 0 <= i <= j <= len(ids):
            raise ValueError(f"argument {name!r}: token range [{i}, {j}) is outside the {len(ids)}-token turn")
        k = torch.arange(max(i, 1), j)
        picked = logp[k - 1, ids[k]].to(torch.float64)
        out[name] = float(picked.sum()) if len(k) else 0.0
    return out


def call_evidence(
    s: Session,
    base: int,
    turn_tokens: Sequence[int],
    args: Mapping[str, tuple[int, int]],
    ref_rows: Mapping[str, Sequence[tuple[int, int]]],
    counterfactual_refs: Collection[str] = (),
) -> CallEvidence:
    """The evidence about a call in ``turn_tokens`` (generated after the context's ``base`` rows):
    each argument's attention mass on each ref of ``ref_rows`` (row ranges below ``base``), and its
    log-probability with the context as it is and, when ``counterfactual_refs`` is given, with their
    live tool segments evicted by RECOMPUTE. ``s`` is not changed."""
    tokens = [int(t) for t in turn_tokens]
    if not tokens:
        raise ValueError("the turn needs at least one token")
    for name, (i, j) in args.items():
        if not 0 <= i <= j <= len(tokens):
            raise ValueError(f"argument {name!r}: token range [{i}, {j}) is outside the {len(tokens)}-token turn")
    for ref, spans in ref_rows.items():
        if any(not 0 <= a <= b <= base for a, b in spans):
            raise LedgerError(f"rows of {ref!r} must lie in the context [0, {base})")
    t0 = time.perf_counter()
    capture = RowMass(ref_rows)
    f = context_fork(s, base)
    logits = teacher_force(f, tokens, capture)
    with_ = arg_logprobs(logits, tokens, args)
    attention = {name: {ref: capture.mass(ref, i, j) for ref in ref_rows} for name, (i, j) in args.items()}
    seconds_attention = time.perf_counter() - t0
    without: dict[str, float] | None = None
    rows, seconds, exactness = 0, 0.0, "not run"
    evicted: tuple[str, ...] = ()
    if counterfactual_refs:
        t1 = time.perf_counter()
        f.truncate(base)  # the same fork, back to the context (no second copy of the cache)
        wanted = set(counterfactual_refs)
        segs = [x for x in f.ledger.live() if x.kind is SegmentKind.TOOL and x.ref in wanted]
        missing = wanted - {x.ref for x in segs}
        if missing:
            raise LedgerError(f"no live tool segment in the context for {sorted(missing)}")
        report = evict(f, [x.id for x in segs], EvictMode.RECOMPUTE)
        without = arg_logprobs(teacher_force(f, tokens), tokens, args)
        seconds = time.perf_counter() - t1
        rows, exactness, evicted = report.rows_replayed, report.exactness, tuple(x.id for x in segs)
    return CallEvidence(
        attention=attention,
        logprob_with=with_,
        logprob_without=without,
        rows_recomputed=rows,
        seconds_attention=seconds_attention,
        seconds_counterfactual=seconds,
        exactness=exactness,
        evicted_segments=evicted,
        unscored=tuple(name for name, (i, j) in args.items() if i == 0 < j),
        turn_rows=len(tokens),
    )


def token_ranges(pieces: Sequence[bytes], spans: Mapping[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The token index range ``[i, j)`` covering each byte span ``[a, b)`` of the turn's text, the
    concatenation of ``pieces`` (each token's own bytes): the first token that ends after ``a``
    to the last that starts before ``b`` (an empty span gets an empty range at its place)."""
    ends: list[int] = []
    pos = 0
    for p in pieces:
        pos += len(p)
        ends.append(pos)
    out: dict[str, tuple[int, int]] = {}
    for name, (a, b) in spans.items():
        if not 0 <= a <= b <= pos:
            raise ValueError(f"span {name!r} [{a}, {b}) is outside the turn's {pos} bytes")
        i = next((k for k, e in enumerate(ends) if e > a), len(ends))
        if b == a:
            out[name] = (i, i)
            continue
        j = next(k for k, e in enumerate(ends) if e >= b) + 1
        out[name] = (i, j)
    return out
