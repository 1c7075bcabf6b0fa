"""A Llama-family transformer forward over an owned KV cache.

The prefill path follows the HF reference's operation order step by step
(RMSNorm in float32, RoPE tables from float32 angles, ``repeat_kv`` then eager
attention with an additive causal mask, SwiGLU), which is what makes a full-
sequence forward oracle-exact. The one-token decode path computes grouped
attention without materialising repeated keys; it is oracle-close, and like
every path here it is deterministic, so two runs that make the same calls are
bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fak.kernel import rope
from fak.kernel.config import ModelConfig
from fak.kernel.kv_cache import KVCache


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


@dataclass
class Weights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # the embedding itself when tied

    def parameters(self) -> int:
        seen: set[int] = set()
        total = 0
        tensors = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            tensors += list(vars(layer).values())
        for t in tensors:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel()
        return total


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + eps)
    return weight * x32.to(dtype)


def _causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask ``(1, 1, T, L)``: 0 where key position ≤ query position, else the dtype's minimum."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=q_pos.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class Llama:
    """Weights plus the forward pass. Stateless between calls: all state is in the ``KVCache``."""

    def __init__(self, cfg: ModelConfig, weights: Weights, model_id: str = "llama") -> None:
        self.cfg = cfg
        self.w = weights
        self.model_id = model_id
        self.device = weights.embed.device
        self.dtype = weights.embed.dtype
        self.inv_freq = rope.inv_freq(cfg, self.device)
        self.scaling = cfg.head_dim**-0.5

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.cfg, capacity=capacity, device=self.device, dtype=self.dtype)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor | list[int],
        cache: KVCache,
        positions: torch.Tensor | None = None,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Run ``tokens`` against ``cache`` (appending their rows) and return logits:
        ``(T, vocab)`` with ``all_logits``, else ``(1, vocab)`` for the last token."""
        ids = torch.as_tensor(tokens, dtype=torch.int64, device=self.device).reshape(-1)
        T = int(ids.shape[0])
        if T == 0:
            raise ValueError("forward needs at least one token")
        start = cache.length
        if positions is None:
            first = cache.next_position()
            positions = torch.arange(first, first + T, dtype=torch.int64, device=self.device)
        cache.reserve(start + T)
        cos, sin = rope.cos_sin(self.inv_freq, positions, self.dtype)
        x = F.embedding(ids, self.w.embed)[None]  # (1, T, D)
        if T == 1:
            x = self._layers_decode(x, cache, start, cos, sin)
        else:
            k_pos = torch.cat([cache.positions[:start], positions])
            mask = _causal_mask(positions, k_pos, self.dtype)
            x = self._layers_prefill(x, cache, start, cos, sin, mask)
        cache.commit(ids, positions)
        x = rms_norm(x, self.w.norm, self.cfg.rms_norm_eps)
        if not all_logits:
            x = x[:, -1:]
        return F.linear(x, self.w.lm_head)[0]

    def _mlp(self, x: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
        h = rms_norm(x, lw.mlp_norm, self.cfg.rms_norm_eps)
        return x + F.linear(F.silu(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)

    def _layers_prefill(
        self,
        x: torch.Tensor,
        cache: KVCache,
        start: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        cfg = self.cfg
        T = x.shape[1]
        end = start + T
        groups = cfg.kv_groups
        for i, lw in enumerate(self.w.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps)
            q = F.linear(h, lw.wq).view(1, T, cfg.num_heads, cfg.head_dim).transpose(1, 2)
            k = F.linear(h, lw.wk).view(1, T, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            v = F.linear(h, lw.wv).view(1, T, cfg.num_kv_heads, cfg.head_dim).transpose(1, 2)
            q = rope.apply(q, cos, sin)
            k_rot = rope.apply(k, cos, sin)
            cache.k[i, start:end] = k_rot[0].transpose(0, 1)
            cache.kraw[i, start:end] = k[0].transpose(0, 1)
            cache.v[i, start:end] = v[0].transpose(0, 1)
            keys = _repeat_kv(cache.k[i, :end], groups)
            values = _repeat_kv(cache.v[i, :end], groups)
            scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling
            scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            attn = torch.matmul(probs, values).transpose(1, 2).contiguous()
            x = x + F.linear(attn.reshape(1, T, -1).contiguous(), lw.wo)
            x = self._mlp(x, lw)
        return x

    def _layers_decode(
        self, x: torch.Tensor, cache: KVCache, start: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        cfg = self.cfg
        end = start + 1
        groups = cfg.kv_groups
        for i, lw in enumerate(self.w.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps)
            q = F.linear(h, lw.wq).view(cfg.num_kv_heads, groups, cfg.head_dim)
            k = F.linear(h, lw.wk).view(cfg.num_kv_heads, cfg.head_dim)
            v = F.linear(h, lw.wv).view(cfg.num_kv_heads, cfg.head_dim)
            q = rope.apply(q, cos, sin)
            cache.k[i, start] = rope.apply(k, cos, sin)
            cache.kraw[i, start] = k
            cache.v[i, start] = v
            keys = cache.k[i, :end].transpose(0, 1)  # (kv_heads, L, head_dim)
            values = cache.v[i, :end].transpose(0, 1)
            scores = torch.bmm(q, keys.transpose(1, 2)) * self.scaling  # (kv_heads, groups, L)
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            attn = torch.bmm(probs, values)  # (kv_heads, groups, head_dim)
            x = x + F.linear(attn.reshape(1, 1, -1), lw.wo)
            x = self._mlp(x, lw)
        return x


def _repeat_kv(rows: torch.Tensor, groups: int) -> torch.Tensor:
    """``(L, kv_heads, head_dim)`` cache rows → ``(1, heads, L, head_dim)``, as HF's ``repeat_kv``."""
    x = rows.transpose(0, 1)[None]
    if groups == 1:
        return x
    b, kvh, L, hd = x.shape
    return x[:, :, None, :, :].expand(b, kvh, groups, L, hd).reshape(b, kvh * groups, L, hd)
