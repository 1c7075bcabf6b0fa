"""Weight formats of the linear layers and the LM head.

``float32`` is the reference (oracle-close to transformers); the others trade
that for speed, because a decode step reads every weight once and is bound by
memory bandwidth (docs/decode.md has the measurements):

- ``float16``: fbgemm's packed float16 linear; activations and sums stay float32,
  so it keeps float32's argmax on the quality prompt set at half the bytes.
  The serving default where fbgemm exists (x86-64 CPU builds of torch).
- ``int8``: per-row int8 weights through fbgemm's dynamic-quantised linear
  (activations quantised to 8 bits per call, int32 sums; VNNI where the CPU has
  it); a quarter of the bytes, the fastest products, and approximate.
- ``bfloat16``: torch bfloat16 matmuls (slower than float32 for matrix-vector
  products on the project's CPU; kept because it runs on any device).
- ``gguf``: the model file's own quantised blocks (Q4_1 / Q8_0), products in C
  as llama.cpp computes them (``kernel/model/blockdot.py``); the fastest decode.

Every format is deterministic: the same input bytes give the same output bytes,
so two runs that make the same calls are bit-exact within a format. A row's
result may depend on the other rows of its call (a blocked GEMM's order, int8's
activation scale): the same calls, not the same rows, are what make a result
repeat, as for the prefix cache already.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import torch
import torch.nn.functional as F

from fak.kernel.model.params import Weights

WEIGHT_FORMATS = ("float32", "float16", "bfloat16", "int8", "gguf")  # gguf: kernel/model/blockdot.py


class Linear(Protocol):
    """``y = x @ W.T`` for ``x`` of shape ``(..., in_features)``, float32 in and out."""

    out_features: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


L_co = TypeVar("L_co", bound=Linear, covariant=True)


@dataclass(frozen=True)
class LayerLinears(Generic[L_co]):
    """The four products of one layer in one weight format."""

    qkv: L_co
    o: L_co
    gate_up: L_co
    down: L_co


class DenseLinear:
    """The weight as it is: ``F.linear``, the same op as the reference path."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w
        self.out_features = int(w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)


class Bf16Linear:
    """bfloat16 weights; the product runs in bfloat16 and returns float32."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w.detach().to(torch.bfloat16).contiguous()
        self.out_features = int(w.shape[0])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.w).to(torch.float32)


def fbgemm_supported() -> bool:
    """fbgemm's packed float16 and dynamic int8 linears: CPU builds of torch on x86-64."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic_fp16")


class Float16Linear:
    """float16 weights packed for fbgemm, float32 activations and accumulation: half
    float32's bytes per token, the weights converted to float32 in registers."""

    def __init__(self, w: torch.Tensor) -> None:
        if not fbgemm_supported():
            raise ValueError("this torch build has no fbgemm: weights='float16' is unavailable")
        self.out_features = int(w.shape[0])
        self.packed = torch.ops.quantized.linear_prepack_fp16(w.detach().to(torch.float32).contiguous(), None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # torch.ops entries are untyped (Any): the result is named to say what it is
        y: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x[None] if x.dim() == 1 else x, self.packed)
        return y[0] if x.dim() == 1 else y


def int8_supported() -> bool:
    """fbgemm's dynamic int8 linear exists in CPU builds of torch on x86-64 (and
    qnnpack on ARM); a build without quantized engines cannot run ``int8``."""
    return bool(torch.backends.quantized.supported_engines) and hasattr(torch.ops.quantized, "linear_dynamic")


def quantise_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: ``w ≈ q * scale[:, None]`` with ``|q| ≤ 127``."""
    w = w.detach().to(torch.float32)
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def cpu_flags() -> set[str]:
    """The CPU's feature flags as Linux reports them (empty where /proc/cpuinfo is not)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


def _has_vnni() -> bool:
    """Whether the CPU has VNNI (u8×s8 products summed straight into int32): without it
    fbgemm's int16 pair sums can saturate on full-range activations, so they are kept
    to 7 bits (``reduce_range``), as torch's own dynamic quantisation does."""
    return bool({"avx512_vnni", "avx_vnni"} & cpu_flags())


REDUCE_RANGE = not _has_vnni()
SMOOTH_ALPHA = 0.5


class Int8Linear:
    """Per-row int8 weights, fbgemm's dynamic-quantised linear (CPU), with two
    corrections without which SmolLM2 loses most of its argmax agreement (measured:
    0.37 over a prompt set, 0.89 with both):

    - SmoothQuant: a few input channels carry activations 100x the others, and one
      scale per row of activations flattens everything else to a few levels. Input
      channel ``j`` is divided by ``s_j = amax_j^α / wmax_j^(1-α)`` and the weight's
      column multiplied by it (``act_absmax``: each channel's largest input seen on a
      fixed calibration sequence).
    - per-row activation scale: fbgemm quantises a call's whole input with one scale,
      so in a prefill the first token's large activations would coarsen every other
      row's; each row is divided by its own largest value first and the result
      multiplied back (a decode row is alone in its call and skips this).
    """

    def __init__(self, w: torch.Tensor, act_absmax: torch.Tensor | None = None, alpha: float = SMOOTH_ALPHA) -> None:
        if not int8_supported():
            raise ValueError("this torch build has no quantized engine: weights='int8' is unavailable")
        w = w.detach().to(torch.float32)
        self.out_features = int(w.shape[0])
        self.in_features = int(w.shape[1])
        if act_absmax is None:
            smooth = torch.ones(self.in_features)
        else:
            wmax = w.abs().amax(dim=0).clamp(min=1e-5)
            smooth = (act_absmax.to(torch.float32).clamp(min=1e-5) ** alpha / wmax ** (1 - alpha)).clamp(min=1e-5)
        self.inv_smooth = (1.0 / smooth).contiguous()
        q, scale = quantise_int8(w * smooth[None, :])
        with warnings.catch_warnings():  # torch marks quantized tensor creation as deprecated
            warnings.simplefilter("ignore")
            # torch has no public constructor from already-rounded int8 values (quantize_per_channel re-rounds)
            qw = torch._make_per_channel_quantized_tensor(  # noqa: SLF001
                q, scale.double(), torch.zeros_like(scale, dtype=torch.int64), 0)
            self.packed = torch.ops.quantized.linear_prepack(qw, None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        one = x.dim() == 1
        x = (x[None] if one else x) * self.inv_smooth
        y: torch.Tensor  # torch.ops entries are untyped (Any)
        if x.numel() == self.in_features:
            y = torch.ops.quantized.linear_dynamic(x, self.packed, REDUCE_RANGE)
        else:
            r = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-30)
            y = torch.ops.quantized.linear_dynamic(x / r, self.packed, REDUCE_RANGE) * r
        return y[0] if one else y


def make_linear(w: torch.Tensor, fmt: str, act_absmax: torch.Tensor | None = None) -> Linear:
    """``w`` in format ``fmt``; ``act_absmax`` (per input channel) is used by ``int8`` only."""
    if fmt == "float32":
        return DenseLinear(w)
    if fmt == "float16":
        return Float16Linear(w)
    if fmt == "bfloat16":
        return Bf16Linear(w)
    if fmt == "int8":
        return Int8Linear(w, act_absmax)
    raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, not {fmt!r}")


class AbsMaxLinear(DenseLinear):
    """A float32 product that remembers the largest input seen per channel (calibration)."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__(w)
        self.absmax = torch.zeros(int(w.shape[1]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.absmax = torch.maximum(self.absmax, x.reshape(-1, x.shape[-1]).abs().amax(dim=0))
        return super().__call__(x)


# per layer, the largest input per channel of its four products (qkv, o, gate_up, down); the LM head's
Calibration = tuple[list[list[torch.Tensor]], torch.Tensor]


def build_linears(
    weights: Weights, fmt: str, calibration: Calibration | None = None
) -> tuple[list[LayerLinears[Linear]], Linear]:
    """Every layer's products and the LM head in format ``fmt`` (not ``gguf``: that is
    ``blockdot.build_block_linears``); ``calibration`` is used by ``int8`` only, which needs it."""
    if fmt != "int8":
        layers = [
            LayerLinears(*(make_linear(t, fmt) for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)))
            for lw in weights.layers
        ]
        return layers, make_linear(weights.lm_head, fmt)
    if calibration is None:
        raise ValueError("weights='int8' needs the calibration of its activations")
    stats, head_stats = calibration
    layers = [
        LayerLinears(*(make_linear(t, fmt, a) for t, a in zip((lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down), st, strict=True)))
        for lw, st in zip(weights.layers, stats, strict=True)
    ]
    return layers, make_linear(weights.lm_head, fmt, head_stats)
