"""How llama.cpp's GGUF files name and lay out the tensors of a Llama (Mistral), Qwen2,
Qwen3 or Gemma 3, in HF terms.

Read by both GGUF readers: ``weights.py`` (the dequantised floats) and ``blockdot.py``
(the file's own blocks), so the two agree on every name and row order.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from fak.kernel.model.config import ModelConfig

GGUF_TO_HF = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3's four norms per layer: ``ffn_norm`` is its pre-MLP norm, and two more follow the
# attention and the MLP. (llama.cpp's converter stores every Gemma norm as 1 + HF's weight:
# the factor RMSNorm multiplies by, which is what fak's weights hold too.)
GEMMA3_TO_HF = GGUF_TO_HF | {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
GLOBAL_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name: str, arch: str = "llama") -> str | None:
    """The HF parameter name of GGUF tensor ``name`` in a model of ``arch`` (``general.architecture``;
    the layer norms' names differ in ``gemma3``) (``blk.N.attn_q.bias`` →
    ``model.layers.N.self_attn.q_proj.bias``; None: one fak does not read)."""
    if name in GLOBAL_TO_HF:
        return GLOBAL_TO_HF[name]
    if name.startswith("blk."):
        _, idx, part, kind = name.split(".", 3)
        table = GEMMA3_TO_HF if arch == "gemma3" else GGUF_TO_HF
        if part in table:
            return f"model.layers.{idx}.{table[part]}.{kind}"
    return None


def rotary_heads(name: str, cfg: ModelConfig) -> int | None:
    """The head count of a Q or K projection whose rows llama.cpp permutes (its ``llama``
    architecture only: Qwen2/Qwen3 keep HF's order), else None."""
    if name.startswith("blk.") and cfg.gguf_permuted:
        part = name.split(".", 3)[2]
        if part == "attn_q":
            return cfg.num_heads
        if part == "attn_k":
            return cfg.num_kv_heads
    return None


A = TypeVar("A", bound=np.generic)


def unpermute(w: np.ndarray[tuple[int, ...], np.dtype[A]], n_head: int) -> np.ndarray[tuple[int, ...], np.dtype[A]]:
    """Undo llama.cpp's rotary permutation of Q/K rows (interleaved pairs → HF halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
