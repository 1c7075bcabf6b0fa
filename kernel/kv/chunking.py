"""Content-defined chunking over token ids (for position-independent reuse).

A Gear rolling hash ``h = (h << 1) + G[token] mod 2^64`` forgets a token after 64
steps, so its value depends on the last 64 tokens only: the same run of tokens
yields the same cut points wherever it lands. A cut falls after a token when the
hash's **top** ``k`` bits are zero (the top bit depends on the whole 64-token
window; the low bits only on the last few tokens, which is why FastCDC masks high
bits too), so chunks average about ``min_size + 2**k`` tokens, clamped to
``[min_size, max_size]``.

Regions: the prompt assembler knows where identical content starts (a session
segment, a retrieved document, a tool schema) and declares those offsets; the hash
restarts at each, so a region's chunks do not depend on what precedes it. Without
markers the whole run is one region: CDC still resynchronises about 64 tokens
after a change. A region's tail shorter than ``min_size`` joins its last chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import blake3
import numpy as np

WINDOW = 64  # tokens the hash sees: a 64-bit state shifted left once per token
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class ChunkParams:
    bits: int = 7  # a cut after ~2**bits tokens past min_size
    min_size: int = 32
    max_size: int = 512

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 32:
            raise ValueError(f"bits must lie in [1, 32], not {self.bits}")
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(f"need 1 ≤ min_size ≤ max_size, not [{self.min_size}, {self.max_size}]")


@lru_cache(maxsize=4)
def gear_table(vocab_size: int) -> tuple[int, ...]:
    """One pseudo-random 64-bit value per token id, fixed for every process and machine."""
    raw = blake3.blake3(b"fak gear table v1").digest(length=8 * vocab_size)
    return tuple(int(x) for x in np.frombuffer(raw, dtype="<u8"))


def chunk_bounds(
    tokens: Sequence[int],
    regions: Sequence[int] = (0,),
    params: ChunkParams = ChunkParams(),  # noqa: B008 - frozen, shared default
    vocab_size: int | None = None,
) -> list[tuple[int, int]]:
    """Cut ``tokens`` into ``[(start, end), ...]`` covering them in order. ``regions``
    are offsets where a region begins (0 is always one)."""
    n = len(tokens)
    if n == 0:
        return []
    table = gear_table(vocab_size or (max(tokens) + 1))
    starts = sorted({0, *(int(r) for r in regions if 0 < int(r) < n)})
    shift = 64 - params.bits
    out: list[tuple[int, int]] = []
    for r, start in enumerate(starts):
        end = starts[r + 1] if r + 1 < len(starts) else n
        first = len(out)
        h = 0
        cut = start
        for i in range(start, end):
            h = ((h << 1) + table[tokens[i]]) & _MASK
            size = i + 1 - cut
            if size >= params.max_size or (size >= params.min_size and h >> shift == 0):
                out.append((cut, i + 1))
                cut = i + 1
        if cut < end:
            if end - cut < params.min_size and len(out) > first:
                out[-1] = (out[-1][0], end)  # a short tail joins the region's last chunk
            else:
                out.append((cut, end))
    return out
