"""One-token decode on the CPU through numpy's BLAS (OpenBLAS).

Decoding one token is a chain of matrix-vector products over every weight
(~540 MB per token for SmolLM2 in float32), so its speed is the speed of
``sgemv``. Measured on the project's 2-core AMD EPYC machines: torch's CPU build
(MKL) runs ``sgemv`` at ~15 GB/s, numpy's OpenBLAS at ~26 GB/s, and a plain
reduction reads memory at ~35 GB/s (``bench/decode.py`` reports the first two).

So the whole step runs in numpy: weights are zero-copy views of the torch
tensors, KV rows are written straight into the cache's storage, and no torch op
runs inside the layer loop. That last part matters: interleaving torch ops
(whose OpenMP pool spins between calls) with OpenBLAS calls (whose threads spin
too) oversubscribes two cores and was measured (by hand) ten times slower.

Same math and operation order as ``Llama._layers_decode`` (the torch path, used
on other devices and dtypes): oracle-close, and bit-exact between two runs that
make the same calls (every output of a matrix-vector product is one dot product
in a fixed order, whatever the thread count).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fak.kernel.model.config import ModelConfig
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.params import Weights


def supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Only CPU float32: numpy has no bfloat16 and cannot see device memory."""
    return device.type == "cpu" and dtype == torch.float32


@dataclass(frozen=True)
class _Layer:
    attn_norm: np.ndarray
    wqkv: np.ndarray
    wo: np.ndarray
    mlp_norm: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray
    qkv_bias: np.ndarray | None  # Qwen2
    q_norm: np.ndarray | None  # Qwen3
    k_norm: np.ndarray | None


def _np(t: torch.Tensor) -> np.ndarray:
    """A zero-copy C-contiguous view (weights are contiguous; a copy only if one is not)."""
    return np.ascontiguousarray(t.detach().numpy())


class BlasDecoder:
    """Holds numpy views of a model's weights and runs one decode step."""

    def __init__(self, cfg: ModelConfig, weights: Weights) -> None:
        self.cfg = cfg
        self.embed = _np(weights.embed)
        self.norm = _np(weights.norm)
        self.lm_head = _np(weights.lm_head)
        self.layers = [
            _Layer(
                *(_np(t) for t in (lw.attn_norm, lw.wqkv, lw.wo, lw.mlp_norm, lw.w_gate_up, lw.w_down)),
                *(None if t is None else _np(t) for t in (lw.qkv_bias, lw.q_norm, lw.k_norm)),
            )
            for lw in weights.layers
        ]
        self.eps = np.float32(cfg.rms_norm_eps)
        self.scale = np.float32(cfg.head_dim**-0.5)

    def _rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        variance = np.dot(x, x) / np.float32(x.shape[0])
        out: np.ndarray = weight * (x * (np.float32(1.0) / np.sqrt(variance + self.eps)))  # numpy types it Any
        return out

    def _head_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """``_rms_norm`` over each row of ``(heads, head_dim)`` (Qwen3's q/k norms)."""
        variance = np.einsum("hd,hd->h", x, x)[:, None] / np.float32(x.shape[1])
        out: np.ndarray = weight * (x * (np.float32(1.0) / np.sqrt(variance + self.eps)))
        return out

    def step(self, token: int, cache: KVCache, cos: torch.Tensor, sin_signed: torch.Tensor,
             keep: torch.Tensor | None = None) -> np.ndarray:
        """Run ``token`` at cache row ``cache.length`` (room reserved by the caller) and
        return the final hidden state after the last norm, ``(hidden,)``. ``cos`` and
        ``sin_signed`` are the ``(1, head_dim)`` tables of ``rope.cos_sin``; ``keep`` the
        rows attended (a sliding window), None for all."""
        cfg = self.cfg
        H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        half, qk_rows = hd // 2, (H + KV) * hd
        row, end = cache.length, cache.length + 1
        c, s = cos.numpy()[0], sin_signed.numpy()[0]
        K, Kraw, V = cache.k.numpy(), cache.kraw.numpy(), cache.v.numpy()
        dropped = None if keep is None else ~keep.numpy()
        x = self.embed[token].copy()
        for i, lw in enumerate(self.layers):
            qkv = lw.wqkv @ self._rms_norm(x, lw.attn_norm)
            if lw.qkv_bias is not None:
                qkv = qkv + lw.qkv_bias
            qk = qkv[:qk_rows].reshape(H + KV, hd)
            if lw.q_norm is not None and lw.k_norm is not None:
                qk = np.concatenate((self._head_norm(qk[:H], lw.q_norm), self._head_norm(qk[H:], lw.k_norm)))
            # rope.apply: x*cos + roll(x, half)*sin_signed (a roll is the halves swapped)
            qk_rot = qk * c + np.concatenate((qk[:, half:], qk[:, :half]), axis=1) * s
            K[i, row] = qk_rot[H:]
            Kraw[i, row] = qk[H:]
            V[i, row] = qkv[qk_rows:].reshape(KV, hd)
            # grouped attention over the token-major rows: q (KV, G, hd) @ K^T (KV, hd, L)
            q = qk_rot[:H].reshape(KV, H // KV, hd)
            scores = np.matmul(q, K[i, :end].transpose(1, 2, 0)) * self.scale
            if dropped is not None:  # rows out of a sliding window weigh exactly 0
                scores[..., dropped] = -np.inf
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            probs = scores / scores.sum(axis=-1, keepdims=True)
            attn = np.matmul(probs, V[i, :end].transpose(1, 0, 2))  # (KV, G, hd)
            x = x + lw.wo @ attn.reshape(H * hd)
            gate, up = np.split(lw.w_gate_up @ self._rms_norm(x, lw.mlp_norm), 2)
            x = x + lw.w_down @ (gate / (np.float32(1.0) + np.exp(-gate)) * up)
        return self._rms_norm(x, self.norm)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.lm_head @ hidden  # numpy types ``@`` of untyped arrays Any
        return out
