"""The PIC serving path: place a registry chunk's rows at new positions, optionally
recompute some of them against the current context.

* ``place``: keys re-rotated from ``Kraw`` at the new positions (RoPE computed as the
  reference computes it, so a chunk served at the position it was computed at gets its
  own bytes back). ``naive=True`` copies the keys as rotated at the source position
  instead: the baseline that shows what re-rotation buys (benchmarks only).
* ``refresh``, over a run of chunks placed back to back, in one masked prefill call:
  ``recompute_first`` recomputes the first ``r`` tokens of each chunk against the
  current context (EPIC's boundary recompute); ``blend_fraction`` recomputes the tokens
  whose layer-1 keys and values deviate most from a fresh computation (CacheBlend's
  selective recompute). Recomputed rows attend to everything at or before their
  position (reused rows included) and replace their reused rows.

Everything here is approximate by construction (the reused rows attended to another
context); the session records it and reports it apart from exact hits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fak.kernel.kv.chunking import ChunkParams
from fak.kernel.kv.pic import PicEntry, PicRegistry
from fak.kernel.model import rope
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.llama import Llama
from fak.kernel.model.params import LayerWeights

FIRST_CHUNK_POSITIONS = 32  # a chunk starting below this position is always prefilled


@dataclass(frozen=True)
class PicBinding:
    """Where a session looks up and inserts PIC chunks, and how it serves them."""

    registry: PicRegistry
    namespace: bytes
    chunking: ChunkParams = ChunkParams()  # noqa: RUF009 - frozen value object
    recompute_first: int = 0
    blend_fraction: float = 0.0
    naive: bool = False  # benchmarks only: no re-rotation
    insert: bool = True  # False: look up only (a benchmark comparing settings on one state)

    def __post_init__(self) -> None:
        if self.recompute_first < 0:
            raise ValueError("recompute_first must be ≥ 0")
        if not 0.0 <= self.blend_fraction <= 1.0:
            raise ValueError("blend_fraction must lie in [0, 1]")


@dataclass(frozen=True)
class PicServed:
    """One chunk served from the registry."""

    chunk_id: str
    row: int  # first cache row it occupies
    tokens: int
    source_position: int
    position: int
    recomputed: int  # of its tokens, recomputed fresh (boundary + selective)

    def as_dict(self) -> dict[str, int | str]:
        return {"chunk_id": self.chunk_id, "row": self.row, "tokens": self.tokens,
                "source_position": self.source_position, "position": self.position,
                "recomputed": self.recomputed}


@torch.inference_mode()
def place(model: Llama, cache: KVCache, entry: PicEntry, naive: bool = False) -> None:
    """Append ``entry``'s rows at the positions that follow the cache."""
    first = cache.next_position()
    n = len(entry)
    positions = torch.arange(first, first + n, dtype=torch.int64, device=cache.device)
    at = positions if not naive else torch.arange(entry.source_position, entry.source_position + n,
                                                  dtype=torch.int64, device=cache.device)
    cos, sin = rope.cos_sin(model.inv_freq, at, model.dtype)  # rotated in the compute dtype, as prefill does
    kraw = entry.kraw.to(device=cache.device, dtype=model.dtype)
    start = cache.length
    cache.reserve(start + n)
    cache.k[:, start : start + n] = rope.apply(kraw, cos[:, None, :], sin[:, None, :])
    cache.kraw[:, start : start + n] = kraw
    cache.v[:, start : start + n] = entry.v.to(device=cache.device, dtype=cache.dtype)
    cache.commit(torch.as_tensor(entry.tokens, dtype=torch.int64, device=cache.device), positions)


@torch.inference_mode()
def refresh(model: Llama, cache: KVCache, start: int, spans: list[tuple[int, int]], binding: PicBinding) -> list[int]:
    """Recompute rows of a run of placed chunks (rows ``[start, cache.length)``, chunk
    ``spans`` relative to ``start``) in one masked prefill call: the first
    ``recompute_first`` rows of each chunk, then the ``blend_fraction`` of the run whose
    layer-1 KV deviates most. Returns how many rows of each chunk were recomputed."""
    end = cache.length
    n = end - start
    chosen = torch.zeros(n, dtype=torch.bool)
    for a, b in spans:
        chosen[a : a + min(binding.recompute_first, b - a - 1)] = True
    if binding.blend_fraction > 0 and n >= 2:
        want = math.ceil(binding.blend_fraction * n)
        deviation = layer1_deviation(model, cache, start, end).cpu().clone()
        deviation[chosen] = -1.0  # already recomputed
        extra = min(want, int((~chosen).sum()))
        if extra:
            chosen[torch.topk(deviation, extra).indices] = True
    if int(chosen.sum()) == 1:  # a prefill call, never the one-token decode path (it has no mask)
        chosen[1 if bool(chosen[0]) else 0] = True
    if chosen.any():
        _recompute(model, cache, start, end, torch.nonzero(chosen).flatten())
    return [int(chosen[a:b].sum()) for a, b in spans]


@torch.inference_mode()
def layer1_deviation(model: Llama, cache: KVCache, start: int, end: int) -> torch.Tensor:
    """Per row in ``[start, end)``: squared distance between the cached layer-1 keys and
    values and the ones a fresh computation against the cache's layer-0 rows gives.
    Layer 0's keys and values depend on the token alone, so layer 1 is the first
    place a different context shows."""
    cfg = model.cfg
    H, KV, hd, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    T = end - start
    dtype = model.dtype
    ids = cache.tokens[start:end]
    pos = cache.positions[start:end]
    cos, sin = rope.cos_sin(model.inv_freq, pos, dtype)
    w0, w1 = model.w.layers[0], model.w.layers[1]
    qkv0, o0, gate_up0, down0, qkv1 = _linears(model)
    x = model.embed(ids)[None]
    h = F.rms_norm(x, (D,), w0.attn_norm, cfg.rms_norm_eps)
    q = _family(qkv0(h), w0)[..., : H * hd].reshape(1, T, H, hd)
    if w0.q_norm is not None:  # Qwen3: each query head normalised before RoPE
        q = F.rms_norm(q, (hd,), w0.q_norm, cfg.rms_norm_eps)
    q = q.transpose(1, 2)
    allowed = cache.positions[:end][None, :] <= pos[:, None]
    if cfg.sliding_window is not None:  # Mistral: keys less than the window back, as the forward attends
        allowed &= cache.positions[:end][None, :] > pos[:, None] - cfg.sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=cache.device).masked_fill_(~allowed, torch.finfo(dtype).min)
    attn = F.scaled_dot_product_attention(
        rope.apply(q, cos, sin),
        cache.k[0, :end].to(dtype).transpose(0, 1)[None],
        cache.v[0, :end].to(dtype).transpose(0, 1)[None],
        attn_mask=mask[None, None],
        scale=model.scaling,
        enable_gqa=cfg.kv_groups > 1,
    ).transpose(1, 2)
    x = x + o0(attn.reshape(1, T, -1))
    h = F.rms_norm(x, (D,), w0.mlp_norm, cfg.rms_norm_eps)
    gate, up = gate_up0(h).chunk(2, dim=-1)
    x = x + down0(F.silu(gate) * up)
    h = F.rms_norm(x, (D,), w1.attn_norm, cfg.rms_norm_eps)
    _, k, v = torch.split(_family(qkv1(h), w1)[0], [H * hd, KV * hd, KV * hd], dim=-1)
    k, v = k.reshape(T, KV, hd), v.reshape(T, KV, hd)
    if w1.k_norm is not None:  # Kraw holds the normalised keys
        k = F.rms_norm(k, (hd,), w1.k_norm, cfg.rms_norm_eps)
    dk = (k - cache.kraw[1, start:end].to(dtype)).pow(2).sum(dim=(1, 2))
    dv = (v - cache.v[1, start:end].to(dtype)).pow(2).sum(dim=(1, 2))
    return dk + dv


_Linear = Callable[[torch.Tensor], torch.Tensor]


def _family(qkv: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    """A q/k/v product with the layer's biases added (Qwen2), as the forward adds them."""
    return qkv if lw.qkv_bias is None else qkv + lw.qkv_bias


def _linears(model: Llama) -> tuple[_Linear, _Linear, _Linear, _Linear, _Linear]:
    """Layer 0's q/k/v, output, gate/up and down products and layer 1's q/k/v, in the
    model's weight format (its ``lin`` table where it has one)."""
    lin = getattr(model, "lin", None)
    if lin is not None:
        return lin[0].qkv, lin[0].o, lin[0].gate_up, lin[0].down, lin[1].qkv
    w0, w1 = model.w.layers[0], model.w.layers[1]

    def dense(w: torch.Tensor) -> _Linear:
        return lambda x: F.linear(x, w)

    return dense(w0.wqkv), dense(w0.wo), dense(w0.w_gate_up), dense(w0.w_down), dense(w1.wqkv)


def _recompute(model: Llama, cache: KVCache, start: int, end: int, chosen: torch.Tensor) -> None:
    """Replace rows ``start + chosen`` (of the cache's tail ``[start, end)``) by a fresh
    computation: they attend to every row at or before their position, reused rows
    included, and to each other; their reused copies are gone first."""
    n = end - start
    keep = torch.ones(n, dtype=torch.bool)
    keep[chosen] = False
    on_device = chosen.to(cache.device)  # the cache's device (a GPU's rows are indexed there)
    tokens = cache.tokens[start:end][on_device].clone()
    positions = cache.positions[start:end][on_device].clone()
    _reorder(cache, start, end, torch.cat([torch.nonzero(keep).flatten(), chosen]))
    cache.truncate(end - len(chosen))
    model.forward(tokens, cache, positions=positions)
    _reorder(cache, start, end, torch.argsort(cache.positions[start:end]))  # back to token order


def _reorder(cache: KVCache, start: int, end: int, order: torch.Tensor) -> None:
    """Permute rows ``[start, end)`` of the cache: new row ``i`` is old row ``order[i]``."""
    idx = order.to(cache.device) + start
    for t in (cache.k, cache.kraw, cache.v):
        t[:, start:end] = t[:, idx].clone()
    for t in (cache.tokens, cache.positions):
        t[start:end] = t[idx].clone()
