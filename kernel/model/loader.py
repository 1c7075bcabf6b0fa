"""One entry point to get a runnable model: ``load_model(path=None)``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from fak.kernel.model import blockdot
from fak.kernel.model import device as devices
from fak.kernel.model.config import ModelError
from fak.kernel.model.llama import Llama
from fak.kernel.model.params import Weights
from fak.kernel.model.tokenizer import ChatTokenizer
from fak.kernel.model.weights import Progress, default_model_path, load_gguf, load_gguf_shapes, load_hf_folder
from fak.settings import StorageSettings


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: ChatTokenizer
    source: Path

    @property
    def model_id(self) -> str:
        return self.model.model_id


def move_weights(w: Weights, device: torch.device, dtype: torch.dtype = torch.float32) -> Weights:
    """``w`` on ``device`` in ``dtype`` (itself when it is there already); a tensor shared by two
    fields (a tied LM head) stays one tensor."""
    if w.embed.device == device and w.embed.dtype == dtype:
        return w
    cache: dict[int, torch.Tensor] = {}

    def conv(t: torch.Tensor) -> torch.Tensor:
        key = t.data_ptr()
        if key not in cache:
            cache[key] = t.to(device=device, dtype=dtype)
        return cache[key]

    def opt(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else conv(t)

    layers = [
        replace(layer, attn_norm=conv(layer.attn_norm), wqkv=conv(layer.wqkv), wo=conv(layer.wo),
                mlp_norm=conv(layer.mlp_norm), w_gate_up=conv(layer.w_gate_up), w_down=conv(layer.w_down),
                qkv_bias=opt(layer.qkv_bias), q_norm=opt(layer.q_norm), k_norm=opt(layer.k_norm),
                post_attn_norm=opt(layer.post_attn_norm), post_mlp_norm=opt(layer.post_mlp_norm))
        for layer in w.layers
    ]
    return Weights(embed=conv(w.embed), layers=layers, norm=conv(w.norm), lm_head=conv(w.lm_head))


def load_model(
    path: str | Path | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Progress | None = None,
    weight_format: str = "float32",
    kv_dtype: torch.dtype | None = None,
    cache_dir: Path | None = None,
) -> LoadedModel:
    """Load the default SmolLM2 (``path=None``), a GGUF file (Llama, Mistral, Qwen2, Qwen3 or
    Gemma 3) or an HF checkpoint folder (the first four: ``config.ModelConfig``).

    ``weight_format`` is that of the linear layers and LM head (``float32``, the
    oracle-close reference; ``float16``, ``int8``, ``bfloat16`` or ``gguf`` (the file's own
    blocks), faster modes: ``kernel/model/quant.py``);
    ``kv_dtype`` that of the KV cache (default ``dtype``); ``device`` where it runs (``cpu``,
    ``cuda[:N]``: ``kernel/model/device.py``; a GGUF file's blocks are dequantised to ``dtype``
    and moved there, the ``gguf`` format's C kernel is CPU only); ``cache_dir`` holds the dequantised
    weights and the compiled gguf kernel (``Settings.cache_dir``; default ``StorageSettings()``'s)."""
    target = devices.resolve(device)  # a CUDA device without CUDA: refused before anything loads
    devices.check_format(target, weight_format)
    src = Path(path).expanduser() if path is not None else default_model_path()
    cache_dir = cache_dir if cache_dir is not None else StorageSettings().cache_dir
    if not src.exists():
        raise ModelError(f"model not found: {src}")
    blocks: dict[str, blockdot.FileTensor] | None = None
    if src.is_dir():
        cfg, weights = load_hf_folder(src)
        tok_folder = src
        model_id = f"hf:{src.resolve()}"
    elif weight_format == "gguf":  # the products read the file's blocks in place: no float copy
        from fak.kernel.model.gguf_file import GGUFFile  # imports gguf: GGUF files only

        blockdot.library(cache_dir)  # built (or found) under the settings' cache dir before the layers load it
        file = GGUFFile(src)
        cfg, weights, tok_folder = load_gguf_shapes(file, lambda t: t in blockdot.COMPUTED_TYPES, cache_dir=cache_dir)
        model_id = f"gguf:{tok_folder.name}"
        blocks = blockdot.gguf_blocks(file, cfg)
    else:
        cfg, weights, tok_folder = load_gguf(src, progress, cache_dir=cache_dir)
        model_id = f"gguf:{tok_folder.name}"
    if blocks is None:
        weights = move_weights(weights, target, dtype)
    model = Llama(cfg, weights, model_id=model_id, weight_format=weight_format, kv_dtype=kv_dtype, blocks=blocks)
    return LoadedModel(model=model, tokenizer=ChatTokenizer.from_folder(tok_folder), source=src)
