"""Token generation as an iterator: greedy or sampled (temperature, top-p, seed),
stopping at stop tokens or ``max_tokens``.

Sampling runs on the host in numpy, on whatever device the model runs: one row
of logits is only the vocabulary, and torch ops over it between CPU decode steps
each wake torch's thread pool, whose spinning then slows the next step's
OpenBLAS calls (``blas_decode``; measured ~10 ms a step for one masked copy)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.llama import Llama


class TokenHook(Protocol):
    """A per-turn observer of sampling: it may change the logits a token is drawn from
    (a grammar's mask, a logit bias, penalties, forcing the end of the turn) and is told
    which token was drawn (to advance its state, record log probabilities, match stop
    strings). Hooks change sampling only, never the forward: the KV of a turn is the KV
    of its tokens, however they were chosen."""

    def adjust(self, step: int, row: np.ndarray) -> np.ndarray:
        """The logits to draw token ``step`` from; ``row`` is a writable float32 copy
        (return it, changed in place, or another array of the same shape)."""
        ...

    def chosen(self, step: int, token: int) -> None:
        """Token ``step`` was drawn (after every hook's ``adjust``)."""
        ...


@runtime_checkable
class BudgetedHook(Protocol):
    """A hook that wants to know the turn's token budget before its first step: ``max_tokens``
    as the loop runs it (after the session capped it to the room left in the context), so that
    at step ``i`` it knows ``max_tokens - i`` tokens can still be drawn (a grammar that must
    close what it opened before the budget ends: ``fak.kernel.openai.constrain``)."""

    def budget(self, max_tokens: int) -> None:
        """The turn will draw at most ``max_tokens`` tokens, this hook's steps 0 to ``max_tokens - 1``."""
        ...


def only(row: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``row`` with every token outside ``allowed`` (ids) set to -inf: what a hook returns to
    force one of a few tokens (the end of the turn, a grammar's only continuation)."""
    out = np.full_like(row, -np.inf)
    out[allowed] = row[allowed]
    return out


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    min_tokens: int = 0  # stop tokens are masked until this many tokens were generated
    temperature: float = 0.0  # 0 → greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    hooks: tuple[TokenHook, ...] = field(default=(), compare=False)  # applied in order, each turn's own

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be ≥ 0")
        if not 0 <= self.min_tokens <= max(self.max_tokens, 0):
            raise ValueError("min_tokens must be between 0 and max_tokens")
        if self.temperature < 0:
            raise ValueError("temperature must be ≥ 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


def sample(row: np.ndarray, params: SamplingParams, rng: np.random.Generator | None) -> int:
    """Pick the next token from one row of logits (a host float32 array).

    Greedy takes the first maximum. Otherwise softmax at ``temperature``; with
    ``top_p < 1`` only the nucleus (the most probable tokens, in order of
    probability then id, until their mass reaches ``top_p``) is drawn from, found
    by partitioning rather than a full sort of the vocabulary."""
    if params.temperature == 0:
        return int(row.argmax())
    temperature = np.float32(params.temperature)
    if temperature == 0:  # below float32's range: the greedy limit
        return int(row.argmax())
    row = row.astype(np.float32)
    with np.errstate(over="ignore"):  # a tiny temperature: every token but the best overflows to -inf
        z = (row - row.max()) / temperature
    probs = np.exp(z)
    candidates = np.arange(probs.shape[0])
    if params.top_p < 1.0:
        candidates = _nucleus(probs / probs.sum(dtype=np.float64), params.top_p)
    cumulative = np.cumsum(probs[candidates], dtype=np.float64)
    rng = rng if rng is not None else np.random.default_rng()
    pick = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(candidates[min(pick, len(candidates) - 1)])


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Token ids of the nucleus, most probable first (ties by id): the same set a full
    stable sort would give, from the top ``k`` tokens with ``k`` grown until it holds it."""
    n = probs.shape[0]
    k = min(64, n)
    while True:
        kth = probs[np.argpartition(-probs, k - 1)[k - 1]] if k < n else probs.min()
        top = np.flatnonzero(probs >= kth)  # every tie of the k-th value too
        top = top[np.lexsort((top, -probs[top]))]
        mass = np.cumsum(probs[top], dtype=np.float64)
        if mass[-1] >= top_p or len(top) == n:
            nucleus: np.ndarray = top[mass - probs[top] < top_p]  # numpy types this indexing Any
            return nucleus
        k = min(4 * k, n)


def generate(
    model: Llama,
    cache: KVCache,
    prompt: list[int] | torch.Tensor | None,
    params: SamplingParams,
    logits: torch.Tensor | None = None,
) -> Iterator[int]:
    """Prefill ``prompt`` (if any) into ``cache``, then yield generated ids one at a time.

    Each yielded token is appended to the cache before the next is computed, except
    a stop token, which is yielded and not appended (the caller decides what the
    turn's end looks like in the cache). ``logits`` may carry the last logits of
    a prefill already made.
    """
    rng = np.random.default_rng(params.seed)
    if prompt is not None and len(prompt) > 0:
        logits = model.forward(prompt, cache)
    if logits is None:
        raise ValueError("generate needs a prompt or the logits of a previous forward")
    stops = np.array(sorted(params.stop_token_ids), dtype=np.int64)
    for hook in params.hooks:
        if isinstance(hook, BudgetedHook):
            hook.budget(params.max_tokens)
    for i in range(params.max_tokens):
        row = logits[-1].detach().to("cpu", torch.float32).numpy()
        if (i < params.min_tokens and len(stops)) or params.hooks:
            row = row.copy()  # the logits may be the caller's
        if i < params.min_tokens and len(stops):
            row[stops] = -np.inf
        for hook in params.hooks:
            row = hook.adjust(i, row)
        if params.hooks and not np.isfinite(row).any():
            raise ValueError("the sampling hooks left no token to draw")
        token = sample(row, params, rng)
        for hook in params.hooks:
            hook.chosen(i, token)
        yield token
        if token in params.stop_token_ids or i == params.max_tokens - 1:
            return
        logits = model.forward([token], cache)
