"""The KV cache as a plain data structure.

One contiguous tensor per kind over all layers, token-major:
``K``, ``Kraw``, ``V`` have shape ``(layers, capacity, kv_heads, head_dim)``,
so the live rows of one layer, ``K[l, :length]``, are contiguous and their
strides do not depend on the capacity (a grown cache computes the same bytes).
``K`` is post-RoPE, ``Kraw`` pre-RoPE (so keys can be re-rotated exactly at a
new position), plus the token id and absolute position of every row.
Capacity grows geometrically; dropped rows are zeroed, not left behind. Storage is
always allocated outside inference mode (also when a forward grows it), so rows a
forward wrote can be cut, zeroed or edited later from anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import blake3
import torch

from fak.kernel.model.config import ModelConfig

MIN_CAPACITY = 64


@dataclass
class KVBlock:
    """A detached run of cache rows (for the prefix cache and PIC chunks)."""

    k: torch.Tensor  # (layers, n, kv_heads, head_dim)
    kraw: torch.Tensor
    v: torch.Tensor
    tokens: torch.Tensor  # (n,) int64
    positions: torch.Tensor  # (n,) int64

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.kraw, self.v, self.tokens, self.positions))

    def rows(self, start: int, end: int) -> KVBlock:
        """Rows ``[start, end)`` as fresh tensors (never a view that pins this block's storage)."""
        return KVBlock(
            k=self.k[:, start:end].clone(),
            kraw=self.kraw[:, start:end].clone(),
            v=self.v[:, start:end].clone(),
            tokens=self.tokens[start:end].clone(),
            positions=self.positions[start:end].clone(),
        )


class KVCache:
    def __init__(
        self,
        cfg: ModelConfig,
        capacity: int = MIN_CAPACITY,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = dtype
        self.length = 0
        self.growths = 0
        self._alloc(max(capacity, 1))

    @torch.inference_mode(False)
    def _alloc(self, capacity: int) -> None:
        shape = (self.cfg.num_layers, capacity, self.cfg.num_kv_heads, self.cfg.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kraw = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.tokens = torch.zeros(capacity, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(capacity, dtype=torch.int64, device=self.device)

    @property
    def capacity(self) -> int:
        return int(self.tokens.shape[0])

    def reserve(self, total: int) -> None:
        """Make room for ``total`` rows, growing geometrically (amortised O(1) per row)."""
        if total <= self.capacity:
            return
        new_cap = max(total, 2 * self.capacity, MIN_CAPACITY)
        old = (self.k, self.kraw, self.v, self.tokens, self.positions)
        n = self.length
        self._alloc(new_cap)
        self.k[:, :n] = old[0][:, :n]
        self.kraw[:, :n] = old[1][:, :n]
        self.v[:, :n] = old[2][:, :n]
        self.tokens[:n] = old[3][:n]
        self.positions[:n] = old[4][:n]
        self.growths += 1

    # --- rows -------------------------------------------------------------
    def next_position(self) -> int:
        return int(self.positions[self.length - 1]) + 1 if self.length else 0

    def commit(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Record ids and positions of rows the forward pass has just written after ``length``."""
        n = int(tokens.shape[0])
        self.tokens[self.length : self.length + n] = tokens
        self.positions[self.length : self.length + n] = positions
        self.length += n

    def truncate(self, length: int) -> None:
        """Drop every row from ``length`` on (zeroed: nothing of a dropped span stays behind)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} rows to {length}")
        self._zero(length, self.length)
        self.length = length

    def delete_rows(self, start: int, end: int) -> None:
        """Remove rows ``[start, end)`` and shift later rows down (positions unchanged)."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"rows [{start}, {end}) are outside the cache of {self.length} rows")
        n, tail = end - start, self.length - end
        if n == 0:
            return
        for t in (self.k, self.kraw, self.v):
            t[:, start : start + tail] = t[:, end : self.length].clone()
        for t in (self.tokens, self.positions):
            t[start : start + tail] = t[end : self.length].clone()
        self._zero(self.length - n, self.length)
        self.length -= n

    def _zero(self, start: int, end: int) -> None:
        for t in (self.k, self.kraw, self.v):
            t[:, start:end] = 0
        self.tokens[start:end] = 0
        self.positions[start:end] = 0

    def export(self, start: int, end: int) -> KVBlock:
        """A detached copy of rows ``[start, end)``."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"rows [{start}, {end}) are outside the cache of {self.length} rows")
        n = self.length
        live = KVBlock(self.k[:, :n], self.kraw[:, :n], self.v[:, :n], self.tokens[:n], self.positions[:n])
        return live.rows(start, end)

    def extend(self, block: KVBlock) -> None:
        """Append a block's rows as they are (same positions, same bytes)."""
        n = len(block)
        self.reserve(self.length + n)
        s = self.length
        self.k[:, s : s + n] = block.k
        self.kraw[:, s : s + n] = block.kraw
        self.v[:, s : s + n] = block.v
        self.commit(block.tokens, block.positions)

    def clone(self) -> KVCache:
        other = KVCache(self.cfg, capacity=self.capacity, device=self.device, dtype=self.dtype)
        other.extend(self.export(0, self.length))
        return other

    # --- accounting and identity --------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        return self.cfg.kv_bytes_per_token(torch.empty((), dtype=self.dtype).element_size()) + 16

    @property
    def nbytes_live(self) -> int:
        return self.length * self.bytes_per_token

    @property
    def nbytes_allocated(self) -> int:
        return self.capacity * self.bytes_per_token

    def token_list(self) -> list[int]:
        return self.tokens[: self.length].tolist()

    def fingerprint(self) -> str:
        """BLAKE3 over live K, V, token ids and positions in a canonical layout:
        a JSON header, then per layer K rows then V rows (row-major
        ``(length, kv_heads, head_dim)``, little-endian), then int64 ids and positions."""
        h = blake3.blake3()
        header = {
            "layout": "fak-kv-v1",
            "layers": self.cfg.num_layers,
            "kv_heads": self.cfg.num_kv_heads,
            "head_dim": self.cfg.head_dim,
            "dtype": str(self.dtype).removeprefix("torch."),
            "length": self.length,
        }
        h.update(json.dumps(header, sort_keys=True).encode())
        n = self.length
        for layer in range(self.cfg.num_layers):
            h.update(_bytes(self.k[layer, :n]))
            h.update(_bytes(self.v[layer, :n]))
        h.update(_bytes(self.tokens[:n]))
        h.update(_bytes(self.positions[:n]))
        return "blake3:" + h.hexdigest()


def _bytes(t: torch.Tensor) -> memoryview | bytes:
    if t.numel() == 0:  # an empty cache (numpy cannot cast a zero-size view)
        return b""
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().data.cast("B")
