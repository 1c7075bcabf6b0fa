"""One-token decode in torch over any weight format (``kernel/model/quant.py``) and KV dtype.

A decode step reads every weight once; with int8 weights that read is a quarter
of float32's, so the ~15 small ops per layer around the four products (norms,
RoPE, cache writes, attention, residuals) become a large share of the step.
This path keeps them few: fused q/k/v and gate/up products, one RoPE call for q
and k together, grouped-query attention straight over the token-major cache
rows (no repeated keys), no per-step allocation of anything larger than a
layer's activations. Each op is deterministic, so two runs that make the same
calls are bit-exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from fak.kernel.model import rope
from fak.kernel.model.config import ModelConfig
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.params import Weights
from fak.kernel.model.quant import LayerLinears, Linear


class FastDecoder:
    """Runs one decode step with a model's linears (any format) over its cache."""

    def __init__(self, cfg: ModelConfig, weights: Weights, linears: Sequence[LayerLinears[Linear]], head: Linear,
                 embed: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """``embed``: token ids ``(T,)`` to rows ``(T, D)`` (``Llama.embed``: a GGUF file's blocks
        in the ``gguf`` format); by default rows of the weights' float table."""
        self.cfg = cfg
        self.w = weights
        self.embed = embed
        self.lin = linears
        self.head = head
        self.scale = cfg.head_dim**-0.5

    def step(self, token: int, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor,
             keep: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``token`` at cache row ``cache.length`` (room reserved by the caller);
        return its logits, ``(1, vocab)`` float32. ``keep``: the rows attended (a sliding window)."""
        cfg = self.cfg
        H, KV, hd, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        eps = cfg.rms_norm_eps
        qk_rows = (H + KV) * hd
        row = cache.length
        end = row + 1
        same = cache.dtype == torch.float32
        x = self.w.embed[token : token + 1] if self.embed is None else self.embed(torch.tensor([token]))  # (1, D)
        for i, (lw, ln) in enumerate(zip(self.w.layers, self.lin, strict=True)):
            qkv = ln.qkv(F.rms_norm(x, (D,), lw.attn_norm, eps))[0]
            if lw.qkv_bias is not None:  # Qwen2
                qkv = qkv + lw.qkv_bias
            qk = qkv[:qk_rows].view(H + KV, hd)
            if lw.q_norm is not None and lw.k_norm is not None:  # Qwen3: each head normalised before RoPE
                qk = torch.cat([F.rms_norm(qk[:H], (hd,), lw.q_norm, eps), F.rms_norm(qk[H:], (hd,), lw.k_norm, eps)])
            qk_rot = rope.apply(qk, cos, sin)
            cache.k[i, row] = qk_rot[H:]
            cache.kraw[i, row] = qk[H:]
            cache.v[i, row] = qkv[qk_rows:].view(KV, hd)
            keys, values = cache.k[i, :end], cache.v[i, :end]
            if not same:
                keys, values = keys.float(), values.float()
            # q (kv_heads, groups, hd) @ K^T (kv_heads, hd, L) → softmax → @ V (kv_heads, L, hd)
            q = qk_rot[:H].view(KV, H // KV, hd)
            scores = torch.matmul(q, keys.permute(1, 2, 0)) * self.scale
            if keep is not None:  # rows out of a sliding window weigh exactly 0
                scores = scores.masked_fill(~keep, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attn = torch.matmul(probs, values.transpose(0, 1))
            x = x + ln.o(attn.view(1, H * hd))
            gate, up = ln.gate_up(F.rms_norm(x, (D,), lw.mlp_norm, eps)).chunk(2, dim=-1)
            x = x + ln.down(F.silu(gate) * up)
        return self.head(F.rms_norm(x, (D,), self.w.norm, eps))
