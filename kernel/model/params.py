"""The model's parameters as tensors: ``Weights`` and one decoder layer's ``LayerWeights``.

Their own module because everything that runs the model reads them (the forward in
``llama.py``, the decode steps, the weight-format factory) and loading writes them
(``weights.py``, ``loader.py``): each of those imports this, none of them imports another
for its types.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerWeights:
    """One decoder layer. Q/K/V and gate/up are stored fused (one matrix-vector
    product each when decoding); the prefill path uses row views of them."""

    attn_norm: torch.Tensor
    wqkv: torch.Tensor  # rows: q (heads*hd), k (kv_heads*hd), v (kv_heads*hd)
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # rows: gate (intermediate), up (intermediate)
    w_down: torch.Tensor
    q_rows: int
    kv_rows: int
    qkv_bias: torch.Tensor | None = None  # Qwen2: the q, k, v biases, fused as the rows of wqkv
    q_norm: torch.Tensor | None = None  # Qwen3: RMSNorm weights (head_dim,) over each query head
    k_norm: torch.Tensor | None = None  # ... and each key head
    post_attn_norm: torch.Tensor | None = None  # Gemma 3: RMSNorm weights over the attention output
    post_mlp_norm: torch.Tensor | None = None  # ... and over the MLP output (attn_norm, mlp_norm: the pre-norms)

    @classmethod
    def fuse(
        cls,
        attn_norm: torch.Tensor,
        wq: torch.Tensor,
        wk: torch.Tensor,
        wv: torch.Tensor,
        wo: torch.Tensor,
        mlp_norm: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        bq: torch.Tensor | None = None,
        bk: torch.Tensor | None = None,
        bv: torch.Tensor | None = None,
        q_norm: torch.Tensor | None = None,
        k_norm: torch.Tensor | None = None,
        post_attn_norm: torch.Tensor | None = None,
        post_mlp_norm: torch.Tensor | None = None,
    ) -> LayerWeights:
        biases = [b for b in (bq, bk, bv) if b is not None]
        if len(biases) not in (0, 3):
            raise ValueError("q, k and v biases come together or not at all")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q and k norms come together or not at all")
        if (post_attn_norm is None) != (post_mlp_norm is None):
            raise ValueError("the post-attention and post-MLP norms come together or not at all")
        return cls(
            attn_norm=attn_norm,
            wqkv=torch.cat([wq, wk, wv]).contiguous(),
            wo=wo,
            mlp_norm=mlp_norm,
            w_gate_up=torch.cat([w_gate, w_up]).contiguous(),
            w_down=w_down,
            q_rows=wq.shape[0],
            kv_rows=wk.shape[0],
            qkv_bias=torch.cat(biases).contiguous() if biases else None,
            q_norm=q_norm,
            k_norm=k_norm,
            post_attn_norm=post_attn_norm,
            post_mlp_norm=post_mlp_norm,
        )

    @property
    def wq(self) -> torch.Tensor:
        return self.wqkv[: self.q_rows]

    @property
    def wk(self) -> torch.Tensor:
        return self.wqkv[self.q_rows : self.q_rows + self.kv_rows]

    @property
    def wv(self) -> torch.Tensor:
        return self.wqkv[self.q_rows + self.kv_rows :]

    @property
    def bq(self) -> torch.Tensor | None:
        return None if self.qkv_bias is None else self.qkv_bias[: self.q_rows]

    @property
    def bk(self) -> torch.Tensor | None:
        return None if self.qkv_bias is None else self.qkv_bias[self.q_rows : self.q_rows + self.kv_rows]

    @property
    def bv(self) -> torch.Tensor | None:
        return None if self.qkv_bias is None else self.qkv_bias[self.q_rows + self.kv_rows :]

    @property
    def w_gate(self) -> torch.Tensor:
        return self.w_gate_up[: self.w_gate_up.shape[0] // 2]

    @property
    def w_up(self) -> torch.Tensor:
        return self.w_gate_up[self.w_gate_up.shape[0] // 2 :]

    def tensors(self) -> list[torch.Tensor]:
        extra = [t for t in (self.qkv_bias, self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm)
                 if t is not None]
        return [self.attn_norm, self.wqkv, self.wo, self.mlp_norm, self.w_gate_up, self.w_down, *extra]


@dataclass
class Weights:
    embed: torch.Tensor
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # the embedding itself when tied

    def parameters(self) -> int:
        seen: set[int] = set()
        total = 0
        tensors = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            tensors += layer.tensors()
        for t in tensors:  # a tied head is the embedding's tensor; a shape-only (meta) tensor has no address
            key = id(t) if t.is_meta else t.data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.numel()
        return total
