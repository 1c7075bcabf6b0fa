"""GGUF files written the way llama.cpp's ``convert_hf_to_gguf`` writes them, for the model tests:
tensor names and metadata keys, Q/K rows rotary-permuted for the ``llama`` architecture, a
byte-level tokenizer, matrices in F32, F16, Q8_0 or (``block_types``) any block type of random
codes and small scales (gguf-py cannot quantise K-quants; any code is a valid weight)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from fak.kernel.model.llama import Llama
from fak.kernel.model.weights import state_dict_from_weights

# where each block type keeps its float16 fields (byte offsets in a block), set to sane scales
HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2],
               "Q5_K": [0, 2], "Q6_K": [208], "Q3_K": [108], "Q2_K": [80, 82]}


# about the largest code times sub-block scale of each type: its float16 scales are drawn below
# weight / CODE_RANGE, so the weights are of a trained model's size (~0.05)
CODE_RANGE = {"Q4_0": 8, "Q4_1": 16, "Q5_0": 16, "Q5_1": 32, "Q8_0": 128, "Q4_K": 15 * 63, "Q5_K": 31 * 63,
              "Q6_K": 32 * 127, "Q3_K": 4 * 32, "Q2_K": 3 * 15}


def random_blocks(type_name: str, rows: int, n: int, seed: int, weight: float = 0.05) -> np.ndarray:
    """``rows`` rows of ``n`` values of random block bytes (any code is valid), their float16
    scales drawn so the weights stay near ``weight`` (scales positive, mins either sign):
    ``(rows, row_bytes)``."""
    values, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, n // values, size), dtype=np.uint8)
    scale = weight / CODE_RANGE[type_name]
    for i, off in enumerate(HALF_FIELDS[type_name]):
        halves = rng.uniform(-scale, scale, size=(rows, n // values)).astype(np.float16)
        if i == 0:
            halves = np.abs(halves)
        blocks[..., off : off + 2] = halves.view(np.uint8).reshape(rows, n // values, 2)
    return blocks.reshape(rows, -1)


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of Q/K rows (HF halves → interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(path: Path, model: Llama, kind: str, arch: str, metadata: dict | None = None,
               block_types: dict[str, str] | None = None) -> None:
    """A GGUF file as llama.cpp's ``convert_hf_to_gguf`` lays one out: its tensor names, Q/K rows
    rotary-permuted for the ``llama`` architecture only, 1-D tensors in F32, matrices in ``kind``
    (F32, F16, Q8_0); the architecture's metadata keys (``gguf.Keys``) and a byte-level tokenizer.
    ``block_types`` (a GGUF tensor name's part, ``attn_v`` or ``token_embd``, to a block type):
    those matrices hold random blocks of that type instead of ``model``'s weights."""
    import gguf

    cfg = model.cfg
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-" + arch)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    if arch == "qwen3":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.sliding_window is not None:
        w.add_sliding_window(cfg.sliding_window)
    for key, value in (metadata or {}).items():
        w.add_uint32(key, value)
    tokens = ["a", "b", "ab"] + [chr(0x100 + i) for i in range(cfg.vocab_size - 4)] + ["<|end|>"]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (cfg.vocab_size - 1) + [3])
    w.add_token_merges([f"{tokens[0]} {tokens[1]}"])
    w.add_eos_token_id(cfg.vocab_size - 1)
    qtype = {"F32": None, "F16": None, "Q8_0": gguf.GGMLQuantizationType.Q8_0}[kind]

    def add(name: str, t: torch.Tensor) -> None:
        a = t.detach().float().numpy().copy()
        part = name.split(".")[-2]
        if a.ndim == 2 and block_types and part in block_types:
            qt = GGMLQuantizationType[block_types[part]]
            seed = sum(map(ord, name))
            w.add_tensor(name, random_blocks(qt.name, a.shape[0], a.shape[1], seed), raw_dtype=qt)
        elif a.ndim == 1 or kind == "F32":
            w.add_tensor(name, a.astype(np.float32))
        elif kind == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)

    sd = state_dict_from_weights(cfg, model.w)
    add("token_embd.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    if not cfg.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_layers):
        for hf_part, gguf_part in GGUF_LAYER.items():
            key = f"model.layers.{i}.{hf_part}"
            if key not in sd:
                continue
            t = sd[key]
            if arch == "llama" and hf_part.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                heads = cfg.num_heads if "q_proj" in hf_part else cfg.num_kv_heads
                t = torch.from_numpy(_llama_cpp_permute(t.numpy(), heads))
            add(f"blk.{i}.{gguf_part}", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
