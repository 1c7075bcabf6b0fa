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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fak.kernel.model import rope
from fak.kernel.model.config import ModelConfig
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.quant import DenseLinear, Linear, make_linear

if TYPE_CHECKING:
    from fak.kernel.model.llama import Weights


@dataclass(frozen=True)
class LayerLinears:
    """The four products of one layer in one weight format."""

    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear


CALIBRATION_TOKENS = 256
CALIBRATION_SEED = 0


class _AbsMax(DenseLinear):
    """A float32 product that remembers the largest input seen per channel."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__(w)
        self.absmax = torch.zeros(int(w.shape[1]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.absmax = torch.maximum(self.absmax, x.reshape(-1, x.shape[-1]).abs().amax(dim=0))
        return super().__call__(x)


def calibrate(cfg: ModelConfig, weights: Weights) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Per-channel largest inputs of every product (and the LM head) over one float32
    prefill of a fixed pseudo-random token sequence. Outlier channels are a property of
    the weights (they appear on any text, strongest on the first token), so no corpus or
    tokenizer is needed, and the result is the same on every load."""
    from fak.kernel.model.llama import Llama  # model imports this module

    ref = Llama(cfg, weights, decode="torch")
    ref.lin = [LayerLinears(*(_AbsMax(t) for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down))) for lw in weights.layers]
    ref.head = _AbsMax(weights.lm_head)
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    n = min(CALIBRATION_TOKENS, cfg.max_position_embeddings)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    ref.forward(ids, ref.new_cache(n), all_logits=True)
    stats = [[ln.qkv.absmax, ln.o.absmax, ln.gate_up.absmax, ln.down.absmax] for ln in ref.lin]  # type: ignore[attr-defined]
    return stats, ref.head.absmax  # type: ignore[attr-defined]


def build_linears(cfg: ModelConfig, weights: Weights, fmt: str) -> tuple[list[LayerLinears], Linear]:
    """Every layer's products and the LM head in format ``fmt`` (``int8`` is calibrated first)."""
    if fmt != "int8":
        layers = [
            LayerLinears(*(make_linear(t, fmt) for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)))
            for lw in weights.layers
        ]
        return layers, make_linear(weights.lm_head, fmt)
    stats, head_stats = calibrate(cfg, weights)
    layers = [
        LayerLinears(*(make_linear(t, fmt, a) for t, a in zip((lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down), st, strict=True)))
        for lw, st in zip(weights.layers, stats, strict=True)
    ]
    return layers, make_linear(weights.lm_head, fmt, head_stats)


class FastDecoder:
    """Runs one decode step with a model's linears (any format) over its cache."""

    def __init__(self, cfg: ModelConfig, weights: Weights, linears: list[LayerLinears], head: Linear) -> None:
        self.cfg = cfg
        self.w = weights
        self.lin = linears
        self.head = head
        self.scale = cfg.head_dim**-0.5

    def step(self, token: int, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Run ``token`` at cache row ``cache.length`` (room reserved by the caller);
        return its logits, ``(1, vocab)`` float32."""
        cfg = self.cfg
        H, KV, hd, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        eps = cfg.rms_norm_eps
        qk_rows = (H + KV) * hd
        row = cache.length
        end = row + 1
        same = cache.dtype == torch.float32
        x = self.w.embed[token : token + 1]  # (1, D)
        for i, (lw, ln) in enumerate(zip(self.w.layers, self.lin, strict=True)):
            qkv = ln.qkv(F.rms_norm(x, (D,), lw.attn_norm, eps))[0]
            qk = qkv[:qk_rows].view(H + KV, hd)
            qk_rot = rope.apply(qk, cos, sin)
            cache.k[i, row] = qk_rot[H:]
            cache.kraw[i, row] = qk[H:]
            cache.v[i, row] = qkv[qk_rows:].view(KV, hd)
            keys, values = cache.k[i, :end], cache.v[i, :end]
            if not same:
                keys, values = keys.float(), values.float()
            # q (kv_heads, groups, hd) @ K^T (kv_heads, hd, L) → softmax → @ V (kv_heads, L, hd)
            q = qk_rot[:H].view(KV, H // KV, hd)
            probs = torch.softmax(torch.matmul(q, keys.permute(1, 2, 0)) * self.scale, dim=-1)
            attn = torch.matmul(probs, values.transpose(0, 1))
            x = x + ln.o(attn.view(1, H * hd))
            gate, up = ln.gate_up(F.rms_norm(x, (D,), lw.mlp_norm, eps)).chunk(2, dim=-1)
            x = x + ln.down(F.silu(gate) * up)
        return self.head(F.rms_norm(x, (D,), self.w.norm, eps))
