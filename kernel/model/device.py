"""Where the model runs (``Settings.device``, ``FAK_DEVICE``) and what makes CUDA deterministic.

``cpu`` (the default) is what fak always ran: the BLAS and gguf C decode steps are CPU paths
and stay so. On ``cuda`` / ``cuda:N`` the same code runs in torch on that GPU: weights,
activations, the KV cache (K, Kraw, V, ids, positions), RoPE tables, masks and positions live
there; whatever hashes or compares KV (fingerprints, the prefix cache's checks, PIC digests)
copies bytes to the host first, so fingerprints are comparable across devices' layouts.

The exactness claims on a GPU (write-time eviction, RECOMPUTE and prefix reuse bit-exact
within the device) need the same call to give the same bytes every time. ``deterministic``
sets, once, before the first CUDA kernel:

* ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (``fak.settings.prepare_cuda_environment``): cuBLAS
  keeps one reduction order per call shape;
* ``torch.use_deterministic_algorithms(True)``: an op with no deterministic CUDA kernel raises
  instead of running;
* TF32 off for matmuls and cuDNN: float32 products stay float32 (TF32 rounds inputs to 10
  mantissa bits, which no oracle-close claim survives);
* fused attention (``sdpa_backends``): the memory-efficient kernel, else the math one. Both
  forward passes are deterministic (a fixed tiling per shape, no atomics; only their backward
  passes accumulate atomically). Flash attention is left out (float16/bfloat16 only, and its
  split-KV heuristics depend on the batch), cuDNN attention too (its engine choice is cuDNN's).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fak.kernel.model.config import ModelError
from fak.settings import prepare_cuda_environment

DEVICE_SETTING = "device (FAK_DEVICE)"


class DeviceError(ModelError):
    """``Settings.device`` names a device this process cannot run the model on."""


def resolve(name: str | torch.device) -> torch.device:
    """``name`` (``cpu``, ``cuda``, ``cuda:N``) as a torch device, checked: a CUDA device
    needs a CUDA build of torch that sees a GPU, and its index must exist. On CUDA the
    determinism switches are set (``deterministic``) before anything runs there."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"setting {DEVICE_SETTING}: {name!r} is not a device ({exc})") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"setting {DEVICE_SETTING}: {name!r}: only cpu and cuda[:N] are supported")
    if not torch.cuda.is_available():
        build = "a CPU-only build of torch" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        raise DeviceError(f"setting {DEVICE_SETTING} is {str(name)!r} but CUDA is not available here ({build}, "
                          "no GPU visible): set FAK_DEVICE=cpu or run where a GPU is")
    count = torch.cuda.device_count()
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not 0 <= index < count:
        raise DeviceError(f"setting {DEVICE_SETTING} is {str(name)!r} but this machine has {count} CUDA device(s)")
    deterministic()
    return torch.device("cuda", index)


def deterministic() -> None:
    """The switches that make every CUDA op of the forward give the same bytes for the same
    call (module docstring). Idempotent; process-wide (torch's switches are)."""
    prepare_cuda_environment()
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


@contextlib.contextmanager
def sdpa_backends(device: torch.device) -> Iterator[None]:
    """Around ``F.scaled_dot_product_attention`` calls: on CUDA, only the memory-efficient and
    math kernels (both deterministic forward); elsewhere nothing changes."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield


def check_format(device: torch.device, weight_format: str) -> None:
    """Refuse, naming both settings, a weight format that has no CUDA path."""
    if device.type == "cuda" and weight_format not in ("float32", "bfloat16"):
        raise DeviceError(
            f"setting weights (FAK_WEIGHTS)={weight_format!r} runs on the CPU only (its products are "
            f"{'the C kernel' if weight_format == 'gguf' else 'fbgemm'}'s); with {DEVICE_SETTING}={str(device)!r} "
            "use float32 (a GGUF file's quantised blocks are dequantised to float32 and moved to the GPU) or bfloat16")
