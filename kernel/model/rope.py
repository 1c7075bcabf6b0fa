"""Rotary position embeddings, computed exactly as the HF reference computes
them: float32 ``inv_freq``, float32 angles ``position * inv_freq``, then
``cos``/``sin`` of ``cat(freqs, freqs)``. Keeping this order is what makes a
key rotated later from ``Kraw`` the same bytes as one rotated during prefill."""

from __future__ import annotations

import math

import torch

from fak.kernel.model.config import ModelConfig


def inv_freq(cfg: ModelConfig, device: torch.device | str = "cpu") -> torch.Tensor:
    dim = cfg.head_dim
    base = cfg.rope_theta
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / dim))
    s = cfg.rope_scaling
    if s.kind == "default":
        return freq
    if s.kind != "llama3":
        raise ValueError(f"unsupported RoPE scaling {s.kind!r}")
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_freq_wavelen, freq / s.factor, freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def cos_sin(freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(T, head_dim)`` tables for absolute ``positions`` (int64, ``(T,)``): ``cos`` and
    ``sin_signed = cat(-sin, sin)`` over the two halves (see ``apply``)."""
    freqs = positions[:, None].float() * freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    half = cos.shape[-1] // 2
    return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``(..., T, head_dim)``) by the tables of ``cos_sin``.

    The reference computes ``x*cos + rotate_half(x)*sin`` with
    ``rotate_half(x) = cat(-x2, x1)``; here ``roll(x) * sin_signed`` =
    ``cat(x2*(-s), x1*s)``, the same products bit for bit (IEEE negation is exact
    and commutes with rounding), in two kernels instead of four.
    """
    return (x * cos) + (x.roll(x.shape[-1] // 2, dims=-1) * sin_signed)
