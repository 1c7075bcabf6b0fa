"""Token generation as an iterator: greedy or sampled (temperature, top-p, seed),
stopping at stop tokens or ``max_tokens``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from fak.kernel.kv_cache import KVCache
from fak.kernel.model import Llama


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    min_tokens: int = 0  # stop tokens are masked until this many tokens were generated
    temperature: float = 0.0  # 0 → greedy
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be ≥ 0")
        if not 0 <= self.min_tokens <= max(self.max_tokens, 0):
            raise ValueError("min_tokens must be between 0 and max_tokens")
        if self.temperature < 0:
            raise ValueError("temperature must be ≥ 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """Pick the next token from one row of logits."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < params.top_p
        sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


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
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device="cpu").manual_seed(params.seed)
    if prompt is not None and len(prompt) > 0:
        logits = model.forward(prompt, cache)
    if logits is None:
        raise ValueError("generate needs a prompt or the logits of a previous forward")
    stops = torch.tensor(sorted(params.stop_token_ids), dtype=torch.int64) if params.min_tokens else None
    for i in range(params.max_tokens):
        row = logits[-1]
        if stops is not None and i < params.min_tokens:
            row = row.clone()
            row[stops.to(row.device)] = float("-inf")
        token = sample(row, params, generator)
        yield token
        if token in params.stop_token_ids or i == params.max_tokens - 1:
            return
        logits = model.forward([token], cache)
