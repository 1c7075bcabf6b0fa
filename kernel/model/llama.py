"""A Llama-family transformer forward over an owned KV cache (Llama, Mistral, Qwen2, Qwen3,
Gemma 3).

The families differ in two steps of attention, both here and in every decode path:
Qwen2 adds biases to the q/k/v products, Qwen3 normalises each query and key head
(RMSNorm over ``head_dim``) before RoPE. The cache's pre-RoPE keys (``Kraw``) are the keys
after both, so re-rotating them at a new position is the same for every family.

Two attention modes. ``eager`` follows the HF reference's operation order
step by step (RMSNorm in float32, RoPE from float32 angles, ``repeat_kv`` then
eager attention with an additive causal mask, SwiGLU), which is what makes a
full-sequence forward oracle-exact. ``sdpa`` (the default) runs the same
prefill with torch's fused attention kernel: oracle-close and several times
faster on long prompts. The one-token decode path is the same in both modes:
fused projections and grouped attention over the cache rows, oracle-close; on
CPU float32 it runs in numpy's BLAS (``blas_decode``, ~1.7x faster sgemv than
torch's MKL here), elsewhere in torch (on a GPU: ``kernel/model/device.py``, which also
sets CUDA's determinism switches). Every path is deterministic, so two runs
that make the same calls are bit-exact.

Gemma 3 (``ModelConfig.gemma``) runs loops of its own (``_gemma_*``), in the same three paths,
where it differs from the Llama layer as transformers' ``Gemma3ForCausalLM`` computes it (and
llama.cpp's ``gemma3`` graph): the embedding multiplied by ``sqrt(hidden_size)``; four RMSNorms
per layer (before and after attention, before and after the MLP), each multiplying by the file's
own factor (llama.cpp stores ``1 + weight``, what transformers multiplies by); q/k head norms;
scores scaled by ``query_pre_attn_scalar ** -0.5``; GeGLU (``gelu_tanh(gate) * up``); local
layers (five of every six) that attend to the keys less than ``sliding_window`` positions back and
rotate with RoPE base 10000, global ones over every earlier key with ``rope_theta``; logits
soft-capped where the config says so. The cache keeps every row: a local layer masks the rows out
of its window (an additive mask in a prefill, ``keep`` rows in a decode step), so each row is
computed once and RECOMPUTE and prefix reuse work as for the other families. Its decode step runs
torch ops over the weight format's products (``gguf``: the block products as ``Linear``s): numpy's
and C's steps compute the Llama layer only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

import torch
import torch.nn.functional as F

from fak.kernel.model import blas_decode, blockdot, rope
from fak.kernel.model import device as devices
from fak.kernel.model.config import ModelConfig
from fak.kernel.model.fast_decode import FastDecoder
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.params import Weights
from fak.kernel.model.quant import (
    WEIGHT_FORMATS,
    AbsMaxLinear,
    Calibration,
    LayerLinears,
    Linear,
    build_linears,
    fbgemm_supported,
    int8_supported,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    x32 = x32 * torch.rsqrt(variance + eps)
    return weight * x32.to(dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """transformers' ``gelu_pytorch_tanh`` (Gemma 3's MLP)."""
    return F.gelu(x, approximate="tanh")


_RopeTables = dict[bool, tuple[torch.Tensor, torch.Tensor]]  # Gemma 3: local layer? -> (cos, sin_signed)


def _causal_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, dtype: torch.dtype, window: int | None = None
) -> torch.Tensor:
    """Additive mask ``(1, 1, T, L)``: 0 where key position ≤ query position (and, with a sliding
    ``window``, key position > query position - window, as transformers masks it), else the
    dtype's minimum."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        allowed &= k_pos[None, :] > q_pos[:, None] - window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=q_pos.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class TokenStep(Protocol):
    """A one-token decode path other than the layer loops below (``FastDecoder``, ``BlockDecoder``)."""

    def step(self, token: int, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor,
             keep: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``token`` at cache row ``cache.length`` (reserved by the caller); its logits ``(1, vocab)``.
        ``keep``: the rows ``[0, length]`` it attends to (a sliding window), None for all."""
        ...


class AttentionCapture(Protocol):
    """Receives each layer's attention probabilities of a captured forward call
    (``Llama.forward(capture=...)``); it reads them and must not modify them."""

    def layer(self, index: int, probs: torch.Tensor) -> None:
        """Layer ``index``'s probabilities ``(1, heads, T, rows)``: query token by cache row."""
        ...


class ForwardRouter(Protocol):
    """Where a model's forward calls run when something schedules them (``fak.kernel.model.scheduler``):
    calls made on other threads are handed to it; it runs them by calling the model again."""

    def routes_here(self) -> bool:
        """True when a call made on the current thread must be handed to ``run``."""
        ...

    def run(self, model: Llama, tokens: torch.Tensor | list[int], cache: KVCache, positions: torch.Tensor | None,
            all_logits: bool, capture: AttentionCapture | None) -> torch.Tensor:
        """Run the call (batched with other sessions' decode steps where it can be) and return its logits."""
        ...


ATTENTION_MODES = ("sdpa", "eager")
DECODE_BACKENDS = ("auto", "blas", "torch")


class Llama:
    """Weights plus the forward pass. Stateless between calls: all state is in the ``KVCache``."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: Weights,
        model_id: str = "llama",
        attention: str = "sdpa",
        decode: str = "auto",
        weight_format: str = "float32",
        kv_dtype: torch.dtype | None = None,
        blocks: dict[str, blockdot.FileTensor] | None = None,
    ) -> None:
        """``decode`` picks the one-token path: ``blas`` (numpy, CPU float32 only),
        ``torch``, or ``auto`` (``blas`` where supported). Keep one choice for a
        model's lifetime: rows decoded by the two paths are close, not equal.

        ``weight_format`` (``float32``, ``bfloat16``, ``int8``; ``kernel/model/quant.py``)
        is that of the linear layers and the LM head; only ``float32`` is oracle-close,
        the others are their own modes, bit-exact within themselves, and carry it in
        ``model_id`` so no cache mixes rows of two modes. ``kv_dtype`` is the cache's
        (default: the weights' dtype). ``blocks`` are the model file's quantised blocks,
        used by ``gguf`` (``kernel/model/blockdot.py``; without them its products are Q8_0)."""
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, not {attention!r}")
        if decode not in DECODE_BACKENDS:
            raise ValueError(f"decode must be one of {DECODE_BACKENDS}, not {decode!r}")
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, not {weight_format!r}")
        self.cfg = cfg
        self.attention = attention
        self.w = weights
        self.device = weights.norm.device  # a GGUF file's gguf weights hold shapes only ("meta") but their norms
        if self.device.type == "cuda":  # also for a model built without load_model / Kernel.open
            devices.deterministic()
        self.dtype = weights.norm.dtype
        self.kv_dtype = kv_dtype or self.dtype
        if weight_format != "float32" and self.dtype != torch.float32:
            raise ValueError(f"weight_format={weight_format!r} needs float32 embeddings and norms, not {self.dtype}")
        if weight_format == "int8" and (self.device.type != "cpu" or not int8_supported()):
            raise ValueError("weight_format='int8' runs on CPU builds of torch with a quantized engine only")
        if weight_format == "float16" and (self.device.type != "cpu" or not fbgemm_supported()):
            raise ValueError("weight_format='float16' runs on x86-64 CPU builds of torch (fbgemm) only")
        if weight_format == "gguf" and self.device.type != "cpu":
            raise ValueError("weight_format='gguf' runs on the CPU only")
        self.weight_format = weight_format
        suffix = "" if weight_format == "float32" else f"+{weight_format}"
        if weight_format == "gguf" and not blocks:  # its own arithmetic: Q8_0 of the floats, not the file's blocks
            suffix += "-q8_0"
        elif weight_format == "gguf":  # v2: prefill and every block type from the file's blocks (v1 prefilled
            suffix += "-v2"  # on dequantised floats and re-quantised all but Q4_1/Q8_0): other bytes, another id
        if self.kv_dtype != self.dtype:
            suffix += "+kv-" + str(self.kv_dtype).removeprefix("torch.")
        if self.device.type != "cpu":  # another device's GEMMs: its rows are its own (CPU ids unchanged)
            suffix += "+" + self.device.type
        self.model_id = model_id + suffix
        # computed on the host and moved, as transformers' buffer is: the same bytes on every device
        self.inv_freq = rope.inv_freq(cfg).to(self.device)
        self.scaling = cfg.attention_scale  # head_dim ** -0.5 (Gemma 3: query_pre_attn_scalar ** -0.5)
        # Gemma 3: its local layers' RoPE (another base) and its embedding scale, sqrt(hidden) as a
        # float32 scalar (transformers' buffer) in the weights' dtype
        self.inv_freq_local = (rope.inv_freq(replace(cfg, rope_theta=cfg.rope_local_theta)).to(self.device)
                               if cfg.gemma and cfg.rope_local_theta is not None else None)
        self.embed_scale = torch.tensor(cfg.hidden_size**0.5).to(device=self.device, dtype=self.dtype)
        # float32 linears are F.linear on the weights themselves: the reference ops, no copy
        self.lin: Sequence[LayerLinears[Linear]]
        self.head: Linear
        block_linears: tuple[list[LayerLinears[blockdot.BlockLinear]], blockdot.BlockLinear] | None = None
        # a GGUF file's embedding read from its blocks (gguf: no float table), else the float table
        self._embedding = blockdot.block_embedding(blocks) if weight_format == "gguf" else None
        if self._embedding is None and weights.embed.is_meta:
            raise ValueError("the weights hold no embedding table and no blocks to read it from")
        if weight_format == "gguf":
            block_linears = blockdot.build_block_linears(cfg, weights, blocks)
            self.lin, self.head = block_linears
        else:
            calibration = calibrate(cfg, weights) if weight_format == "int8" else None
            self.lin, self.head = build_linears(weights, weight_format, calibration)
        reference = weight_format == "float32" and self.kv_dtype == self.dtype
        # numpy's and C's decode steps compute the Llama layer: Gemma 3 decodes in _gemma_decode
        blas_ok = reference and blas_decode.supported(self.device, self.dtype) and not cfg.gemma
        if decode == "blas" and not blas_ok:
            raise ValueError(
                f"decode='blas' needs CPU float32 weights and KV, not {self.device} {weight_format} "
                f"weights with {self.kv_dtype} KV"
            )
        use_blas = decode == "blas" or (decode == "auto" and blas_ok)
        self.decode = "blas" if use_blas else "torch"
        self._blas = blas_decode.BlasDecoder(cfg, weights) if use_blas else None
        # the torch path of the reference mode stays op for op what it was (oracle-close)
        self._fast: TokenStep | None
        self._batch: blockdot.BlockDecoder | None = None
        if block_linears is not None and self.kv_dtype == torch.float32 and not cfg.gemma:
            self._fast = self._batch = blockdot.BlockDecoder(cfg, weights, *block_linears, embedding=self._embedding)
        else:
            self._fast = None if use_blas or reference or cfg.gemma else FastDecoder(cfg, weights, self.lin, self.head, self.embed)
        self.router: ForwardRouter | None = None  # set by a scheduler that runs this model's calls

    @property
    def batches_decode(self) -> bool:
        """Whether one-token steps of several sessions run as one call (``forward_batch``) whose
        rows are the bytes each computes alone: the ``gguf`` format's C decoder with a float32
        cache. Other formats' products depend on the other rows of a call (a blocked GEMM's
        order, int8's activation scale), so their sessions' steps run one call each."""
        return self._batch is not None

    def batchable(self, tokens: torch.Tensor | list[int], positions: torch.Tensor | None, all_logits: bool,
                  capture: AttentionCapture | None) -> bool:
        """A forward call that ``forward_batch`` can run with other sessions' (a plain decode step)."""
        return self._batch is not None and positions is None and capture is None and len(tokens) == 1

    @torch.inference_mode()
    def forward_batch(self, steps: Sequence[tuple[int, KVCache]]) -> list[torch.Tensor]:
        """One decode step of each of several sessions (a token and its session's cache, each
        cache once) in one pass over the weights; each step's logits ``(1, vocab)``, the bytes
        ``forward([token], cache)`` returns for it alone (and the same cache rows)."""
        if self._batch is None:
            raise ValueError(f"{self.model_id} does not batch decode steps (only gguf with a float32 cache)")
        for token, _ in steps:
            if not 0 <= token < self.cfg.vocab_size:
                raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size})")
        tables = []
        keeps = []
        for _, cache in steps:
            first = cache.next_position()
            position = torch.arange(first, first + 1, dtype=torch.int64, device=self.device)
            cache.reserve(cache.length + 1)
            tables.append((position, *rope.cos_sin(self.inv_freq, position, self.dtype)))  # one row as alone
            keeps.append(self._window_keep(cache, cache.length, first))
        cos = torch.cat([c for _, c, _ in tables])
        sin = torch.cat([s for _, _, s in tables])
        logits = self._batch.step_batch([t for t, _ in steps], [c for _, c in steps], cos, sin, keeps)
        out = []
        for i, ((token, cache), (position, _, _)) in enumerate(zip(steps, tables, strict=True)):
            cache.commit(torch.tensor([token], dtype=torch.int64), position)
            out.append(logits[i : i + 1].clone())
        return out

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The token embeddings of ``ids`` ``(T,)`` as ``(T, D)``: rows of the float table, or
        dequantised from the file's blocks (``gguf``)."""
        if self._embedding is not None:
            return self._embedding(ids)
        return F.embedding(ids, self.w.embed)

    def new_cache(self, capacity: int = 256) -> KVCache:
        return KVCache(self.cfg, capacity=capacity, device=self.device, dtype=self.kv_dtype)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor | list[int],
        cache: KVCache,
        positions: torch.Tensor | None = None,
        all_logits: bool = False,
        capture: AttentionCapture | None = None,
    ) -> torch.Tensor:
        """Run ``tokens`` against ``cache`` (appending their rows) and return logits:
        ``(T, vocab)`` with ``all_logits``, else ``(1, vocab)`` for the last token.
        ``capture``: run the eager path (whatever the attention mode, one token included) and
        hand it each layer's attention probabilities; without it every path is as it was.
        With a ``router`` (a scheduler), a call from another thread runs on the scheduler's."""
        if self.router is not None and self.router.routes_here():
            return self.router.run(self, tokens, cache, positions, all_logits, capture)
        ids = torch.as_tensor(tokens, dtype=torch.int64, device=self.device).reshape(-1)
        T = int(ids.shape[0])
        if T == 0:
            raise ValueError("forward needs at least one token")
        if int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.cfg.vocab_size})")
        start = cache.length
        if positions is None:
            first = cache.next_position()
            positions = torch.arange(first, first + T, dtype=torch.int64, device=self.device)
        else:  # a caller's positions (RECOMPUTE, PIC) may be host tensors: RoPE and masks run on the model's device
            positions = positions.to(self.device)
        cache.reserve(start + T)
        if self.cfg.gemma:
            return self._gemma_forward(ids, cache, start, positions, all_logits, capture)
        cos, sin = rope.cos_sin(self.inv_freq, positions, self.dtype)
        window = self.cfg.sliding_window
        keep = self._window_keep(cache, start, positions) if T == 1 and self.cfg.sliding_window is not None else None
        if capture is not None:
            x = self.embed(ids)[None]
            full = _causal_mask(positions, torch.cat([cache.positions[:start], positions]), self.dtype, window)
            x = self._layers_prefill_eager(x, cache, start, cos, sin, full, capture)
            cache.commit(ids, positions)
            x = rms_norm(x, self.w.norm, self.cfg.rms_norm_eps)
            return self.head(x if all_logits else x[:, -1:])[0]
        if T == 1 and self._blas is not None:
            hidden = self._blas.step(int(ids[0]), cache, cos, sin, keep)
            cache.commit(ids, positions)
            return torch.from_numpy(self._blas.logits(hidden))[None]
        if T == 1 and self._fast is not None:
            logits = self._fast.step(int(ids[0]), cache, cos, sin, keep)
            cache.commit(ids, positions)
            return logits
        x = self.embed(ids)[None]  # (1, T, D)
        if T == 1:
            x = self._layers_decode(x, cache, start, cos, sin, keep)
        elif self.attention == "eager":
            full = _causal_mask(positions, torch.cat([cache.positions[:start], positions]), self.dtype, window)
            x = self._layers_prefill_eager(x, cache, start, cos, sin, full)
        else:  # a first chunk needs no mask (plain causal attention) unless a window leaves keys out
            mask: torch.Tensor | None = None
            if start > 0 or (window is not None and int(positions.max() - positions.min()) >= window):
                mask = _causal_mask(positions, torch.cat([cache.positions[:start], positions]), self.dtype, window)
            with devices.sdpa_backends(self.device):  # on CUDA, the deterministic kernels only
                x = self._layers_prefill_sdpa(x, cache, start, cos, sin, mask, last_row_only=not all_logits)
        cache.commit(ids, positions)
        x = rms_norm(x, self.w.norm, self.cfg.rms_norm_eps)
        if not all_logits:
            x = x[:, -1:]
        return self.head(x)[0]

    def _window_keep(self, cache: KVCache, start: int, position: int | torch.Tensor) -> torch.Tensor | None:
        """The cache rows ``[0, start]`` a one-token step at ``position`` (an int, or a tensor
        whose first element it is) attends to under a sliding window (one bool per row; the new
        row ``start`` always), or None when the window leaves none of them out (always, for the
        families without one)."""
        if self.cfg.sliding_window is None or start == 0:
            return None
        first = self.cfg.window_start(int(position) if isinstance(position, int) else int(position[0]))
        past = cache.positions[:start]
        if int(past.min()) >= first:
            return None
        keep = torch.ones(start + 1, dtype=torch.bool, device=cache.device)
        keep[:start] = past >= first
        return keep

    def _rows(self, cache: KVCache, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache keys and values of a layer, ``(end, kv_heads, head_dim)``, in the compute dtype."""
        k, v = cache.k[layer, :end], cache.v[layer, :end]
        if k.dtype != self.dtype:
            k, v = k.to(self.dtype), v.to(self.dtype)
        return k, v

    def _qkv_reference(self, h: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The reference's three products (row views of the fused weight: the same matrices),
        with their biases in the same call where the family has them, as ``nn.Linear`` does."""
        lw = self.w.layers[i]
        return F.linear(h, lw.wq, lw.bq), F.linear(h, lw.wk, lw.bk), F.linear(h, lw.wv, lw.bv)

    def _qkv_fused(self, h: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One product in the model's weight format (plus the fused biases), split into q, k, v."""
        H, KV, hd = self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        qkv = self.lin[i].qkv(h)
        bias = self.w.layers[i].qkv_bias
        if bias is not None:
            qkv = qkv + bias
        q, k, v = torch.split(qkv, [H * hd, KV * hd, KV * hd], dim=-1)
        return q, k, v

    def _qk_norm(self, q: torch.Tensor, k: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Qwen3's RMSNorm over each head of ``q`` and ``k`` (``(..., heads, head_dim)``), as the
        reference's ``Qwen3RMSNorm`` computes it; unchanged for the other families."""
        lw = self.w.layers[i]
        if lw.q_norm is None or lw.k_norm is None:
            return q, k
        eps = self.cfg.rms_norm_eps
        return rms_norm(q, lw.q_norm, eps), rms_norm(k, lw.k_norm, eps)

    def _mlp_reference(self, x: torch.Tensor, i: int) -> torch.Tensor:
        lw = self.w.layers[i]
        h = rms_norm(x, lw.mlp_norm, self.cfg.rms_norm_eps)
        return x + F.linear(F.silu(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)

    def _mlp_fused(self, x: torch.Tensor, i: int) -> torch.Tensor:
        lw, ln = self.w.layers[i], self.lin[i]
        h = F.rms_norm(x, (self.cfg.hidden_size,), lw.mlp_norm, self.cfg.rms_norm_eps)
        gate, up = ln.gate_up(h).chunk(2, dim=-1)
        return x + ln.down(F.silu(gate) * up)

    def _layers_prefill_eager(
        self, x: torch.Tensor, cache: KVCache, start: int, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
        capture: AttentionCapture | None = None,
    ) -> torch.Tensor:
        """The HF reference's operation order, step by step (oracle-exact). The products are
        chosen once, not per layer: float32 runs the reference's own (separate q/k/v and
        gate/up), another weight format its fused ones. ``capture`` reads each layer's probabilities."""
        cfg = self.cfg
        T = x.shape[1]
        end = start + T
        H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        reference = self.weight_format == "float32"
        qkv = self._qkv_reference if reference else self._qkv_fused
        mlp = self._mlp_reference if reference else self._mlp_fused
        for i, lw in enumerate(self.w.layers):
            h = rms_norm(x, lw.attn_norm, cfg.rms_norm_eps)
            q, k, v = qkv(h, i)
            q, k = self._qk_norm(q.reshape(1, T, H, hd), k.reshape(1, T, KV, hd), i)
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = v.reshape(1, T, KV, hd).transpose(1, 2)
            q = rope.apply(q, cos, sin)
            self._store_kv(cache, i, start, rope.apply(k, cos, sin), k, v)
            k_rows, v_rows = self._rows(cache, i, end)
            keys = _repeat_kv(k_rows, cfg.kv_groups)
            values = _repeat_kv(v_rows, cfg.kv_groups)
            scores = torch.matmul(q, keys.transpose(2, 3)) * self.scaling
            scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            if capture is not None:
                capture.layer(i, probs)
            attn = torch.matmul(probs, values).transpose(1, 2).contiguous()
            x = x + self.lin[i].o(attn.reshape(1, T, -1).contiguous())
            x = mlp(x, i)
        return x

    def _attention_sdpa(self, h: torch.Tensor, x: torch.Tensor, i: int, cache: KVCache, start: int,
                        cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                        last_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``i``'s attention in a prefill over its normed input ``h`` ``(1, T, D)``, torch's fused
        kernel: the chunk's K/V rows stored, then ``(x, attn)``: the residual stream and the output
        projection's input ``(1, rows, H * hd)``, both cut to the last row where ``last_row`` (the
        last token attends to every key up to its own position: no mask needed unless positions were
        given out of order, and then only its own row of it)."""
        cfg = self.cfg
        H, KV, hd, T = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, h.shape[1]
        q, k, v = self._qkv_fused(h, i)
        q, k = self._qk_norm(q.view(1, T, H, hd), k.view(1, T, KV, hd), i)
        k = k.transpose(1, 2)
        self._store_kv(cache, i, start, rope.apply(k, cos, sin), k, v.view(1, T, KV, hd).transpose(1, 2))
        q = q.transpose(1, 2)
        if last_row and T > 1:
            x, q, cos, sin = x[:, -1:], q[:, :, -1:], cos[-1:], sin[-1:]
            mask = mask[..., -1:, :] if mask is not None else None
            rows, causal = 1, False
        else:
            rows, causal = T, mask is None
        k_rows, v_rows = self._rows(cache, i, start + T)
        attn = F.scaled_dot_product_attention(
            rope.apply(q, cos, sin),
            k_rows.transpose(0, 1)[None],
            v_rows.transpose(0, 1)[None],
            attn_mask=mask,
            is_causal=causal,
            scale=self.scaling,
            enable_gqa=cfg.kv_groups > 1,
        ).transpose(1, 2)
        return x, attn.reshape(1, rows, -1)

    def _layers_prefill_sdpa(
        self,
        x: torch.Tensor,
        cache: KVCache,
        start: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        last_row_only: bool,
    ) -> torch.Tensor:
        """Fused q/k/v and gate/up projections and torch's fused attention. ``mask`` is
        None only for a first chunk (plain causal attention). With ``last_row_only`` the
        last layer runs attention, output projection and MLP for the last token alone:
        the cache needs only that layer's keys and values from the other rows."""
        cfg = self.cfg
        D = cfg.hidden_size
        last_layer = len(self.w.layers) - 1
        for i, lw in enumerate(self.w.layers):
            h = F.rms_norm(x, (D,), lw.attn_norm, cfg.rms_norm_eps)
            x, attn = self._attention_sdpa(h, x, i, cache, start, cos, sin, mask, last_row_only and i == last_layer)
            x = x + self.lin[i].o(attn)
            x = self._mlp_fused(x, i)
        return x

    @staticmethod
    def _store_kv(
        cache: KVCache, layer: int, start: int, k_rot: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write ``(1, kv_heads, T, head_dim)`` keys and values as token-major cache rows."""
        end = start + k.shape[2]
        cache.k[layer, start:end] = k_rot[0].transpose(0, 1)
        cache.kraw[layer, start:end] = k[0].transpose(0, 1)
        cache.v[layer, start:end] = v[0].transpose(0, 1)

    def _layers_decode(
        self, x: torch.Tensor, cache: KVCache, start: int, cos: torch.Tensor, sin: torch.Tensor,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One token: fused projections, one RoPE call for q and k together, and
        grouped-query attention straight over the cache rows (no repeated keys).
        (torch's CPU SDPA kernel was measured slower and erratic for one query row.)"""
        cfg = self.cfg
        H, KV, hd, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        eps = cfg.rms_norm_eps
        end = start + 1
        qk_rows = (H + KV) * hd
        x = x.view(D)  # one token: matrix-vector products throughout
        for i, lw in enumerate(self.w.layers):
            qkv = torch.mv(lw.wqkv, F.rms_norm(x, (D,), lw.attn_norm, eps))
            if lw.qkv_bias is not None:
                qkv = qkv + lw.qkv_bias
            qk = qkv[:qk_rows].view(H + KV, hd)
            if lw.q_norm is not None and lw.k_norm is not None:
                qk = torch.cat([F.rms_norm(qk[:H], (hd,), lw.q_norm, eps), F.rms_norm(qk[H:], (hd,), lw.k_norm, eps)])
            qk_rot = rope.apply(qk, cos, sin)
            cache.k[i, start] = qk_rot[H:]
            cache.kraw[i, start] = qk[H:]
            cache.v[i, start] = qkv[qk_rows:].view(KV, hd)
            # grouped attention straight over the token-major cache rows (no copies):
            # q (kv_heads, groups, hd) @ K^T (kv_heads, hd, L) → softmax → @ V (kv_heads, L, hd)
            q = qk_rot[:H].view(KV, H // KV, hd)
            scores = torch.matmul(q, cache.k[i, :end].permute(1, 2, 0)) * self.scaling
            if keep is not None:  # a sliding window: rows out of it weigh exactly 0
                scores = scores.masked_fill(~keep, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attn = torch.matmul(probs, cache.v[i, :end].transpose(0, 1))
            x = x + torch.mv(lw.wo, attn.view(H * hd))
            gate, up = torch.mv(lw.w_gate_up, F.rms_norm(x, (D,), lw.mlp_norm, eps)).chunk(2)
            x = x + torch.mv(lw.w_down, F.silu(gate) * up)
        return x.view(1, 1, D)

    # --- Gemma 3 (ModelConfig.gemma) ---------------------------------------------------------------


    def _gemma_forward(self, ids: torch.Tensor, cache: KVCache, start: int, positions: torch.Tensor,
                       all_logits: bool, capture: AttentionCapture | None) -> torch.Tensor:
        """``Llama.forward`` for a Gemma 3 model, after the cache has room for ``ids``: runs them at
        ``positions``, commits their rows and returns the logits (all rows, or the last)."""
        cfg, dtype = self.cfg, self.dtype
        T = int(ids.shape[0])
        tables: _RopeTables = {False: rope.cos_sin(self.inv_freq, positions, dtype)}
        if self.inv_freq_local is not None:
            tables[True] = rope.cos_sin(self.inv_freq_local, positions, dtype)
        x = self.embed(ids)[None] * self.embed_scale  # (1, T, D), as Gemma3TextScaledWordEmbedding
        if T == 1 and capture is None:
            keeps = {False: None, True: self._window_keep(cache, start, positions)}
            x = self._gemma_decode(x, cache, start, tables, keeps)
        else:
            keys = torch.cat([cache.positions[:start], positions])
            span = int(positions.max() - positions.min())
            masks: dict[bool, torch.Tensor | None] = {}
            for local in (False, True):
                window = cfg.sliding_window if local else None
                # a first chunk needs no mask in sdpa (plain causal attention) unless a window leaves keys out
                needed = capture is not None or self.attention == "eager" or start > 0 or (
                    window is not None and span >= window)
                masks[local] = _causal_mask(positions, keys, dtype, window) if needed else None
            if capture is not None or self.attention == "eager":
                x = self._gemma_prefill_eager(x, cache, start, tables, masks, capture)
            else:
                with devices.sdpa_backends(self.device):  # on CUDA, the deterministic kernels only
                    x = self._gemma_prefill_sdpa(x, cache, start, tables, masks, last_row_only=not all_logits)
        cache.commit(ids, positions)
        x = rms_norm(x, self.w.norm, cfg.rms_norm_eps)
        if not all_logits:
            x = x[:, -1:]
        logits = self.head(x)[0]
        cap = cfg.final_logit_softcapping
        if cap is not None:  # as transformers: divide, tanh, multiply
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _gemma_prefill_eager(self, x: torch.Tensor, cache: KVCache, start: int, tables: _RopeTables,
                             masks: dict[bool, torch.Tensor | None], capture: AttentionCapture | None) -> torch.Tensor:
        """The reference's operation order, step by step (oracle-exact in float32): the reference's
        own products (separate q/k/v and gate/up) in float32, the format's fused ones otherwise."""
        cfg = self.cfg
        T = x.shape[1]
        end = start + T
        H, KV, hd, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
        reference = self.weight_format == "float32"
        qkv = self._qkv_reference if reference else self._qkv_fused
        for i, lw in enumerate(self.w.layers):
            assert lw.post_attn_norm is not None and lw.post_mlp_norm is not None
            local = cfg.layer_local(i)
            cos, sin = tables[local]
            mask = masks[local]
            q, k, v = qkv(rms_norm(x, lw.attn_norm, eps), i)
            q, k = self._qk_norm(q.reshape(1, T, H, hd), k.reshape(1, T, KV, hd), i)
            q = rope.apply(q.transpose(1, 2), cos, sin)
            k = k.transpose(1, 2)
            self._store_kv(cache, i, start, rope.apply(k, cos, sin), k, v.reshape(1, T, KV, hd).transpose(1, 2))
            k_rows, v_rows = self._rows(cache, i, end)
            scores = torch.matmul(q, _repeat_kv(k_rows, cfg.kv_groups).transpose(2, 3)) * self.scaling
            if mask is not None:
                scores = scores + mask
            probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            if capture is not None:
                capture.layer(i, probs)
            attn = torch.matmul(probs, _repeat_kv(v_rows, cfg.kv_groups)).transpose(1, 2).contiguous()
            x = x + rms_norm(self.lin[i].o(attn.reshape(1, T, -1).contiguous()), lw.post_attn_norm, eps)
            h = rms_norm(x, lw.mlp_norm, eps)
            if reference:
                m = F.linear(_gelu_tanh(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)
            else:
                gate, up = self.lin[i].gate_up(h).chunk(2, dim=-1)
                m = self.lin[i].down(_gelu_tanh(gate) * up)
            x = x + rms_norm(m, lw.post_mlp_norm, eps)
        return x


    def _gemma_prefill_sdpa(self, x: torch.Tensor, cache: KVCache, start: int, tables: _RopeTables,
                            masks: dict[bool, torch.Tensor | None], last_row_only: bool) -> torch.Tensor:
        """Fused products and torch's fused attention (oracle-close). A mask of None is plain causal
        attention (a first chunk). With ``last_row_only`` the last layer runs attention and the
        MLP for the last token alone (the cache needs only that layer's keys and values of the others)."""
        cfg = self.cfg
        D, eps = cfg.hidden_size, cfg.rms_norm_eps
        last_layer = len(self.w.layers) - 1
        for i, lw in enumerate(self.w.layers):
            assert lw.post_attn_norm is not None and lw.post_mlp_norm is not None
            local = cfg.layer_local(i)
            cos, sin = tables[local]
            mask = masks[local]
            h = F.rms_norm(x, (D,), lw.attn_norm, eps)
            x, attn = self._attention_sdpa(h, x, i, cache, start, cos, sin, mask, last_row_only and i == last_layer)
            x = x + F.rms_norm(self.lin[i].o(attn), (D,), lw.post_attn_norm, eps)
            gate, up = self.lin[i].gate_up(F.rms_norm(x, (D,), lw.mlp_norm, eps)).chunk(2, dim=-1)
            x = x + F.rms_norm(self.lin[i].down(_gelu_tanh(gate) * up), (D,), lw.post_mlp_norm, eps)
        return x


    def _gemma_decode(self, x: torch.Tensor, cache: KVCache, start: int, tables: _RopeTables,
                      keeps: dict[bool, torch.Tensor | None]) -> torch.Tensor:
        """One token through the model's weight-format products (``Llama.lin``), grouped-query
        attention straight over the cache rows; a local layer's rows out of the window weigh 0."""
        cfg = self.cfg
        H, KV, hd, D, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size, cfg.rms_norm_eps
        end = start + 1
        qk_rows = (H + KV) * hd
        x = x.view(1, D)
        for i, (lw, ln) in enumerate(zip(self.w.layers, self.lin, strict=True)):
            assert lw.q_norm is not None and lw.k_norm is not None
            assert lw.post_attn_norm is not None and lw.post_mlp_norm is not None
            local = cfg.layer_local(i)
            cos, sin = tables[local]
            qkv = ln.qkv(F.rms_norm(x, (D,), lw.attn_norm, eps))[0]
            qk = qkv[:qk_rows].view(H + KV, hd)
            qk = torch.cat([F.rms_norm(qk[:H], (hd,), lw.q_norm, eps), F.rms_norm(qk[H:], (hd,), lw.k_norm, eps)])
            qk_rot = rope.apply(qk, cos, sin)
            cache.k[i, start] = qk_rot[H:]
            cache.kraw[i, start] = qk[H:]
            cache.v[i, start] = qkv[qk_rows:].view(KV, hd)
            keys, values = self._rows(cache, i, end)
            q = qk_rot[:H].view(KV, H // KV, hd)
            scores = torch.matmul(q, keys.permute(1, 2, 0)) * self.scaling
            keep = keeps[local]
            if keep is not None:  # rows out of a local layer's window weigh exactly 0
                scores = scores.masked_fill(~keep, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            attn = torch.matmul(probs, values.transpose(0, 1))
            x = x + F.rms_norm(ln.o(attn.reshape(1, H * hd)), (D,), lw.post_attn_norm, eps)
            gate, up = ln.gate_up(F.rms_norm(x, (D,), lw.mlp_norm, eps)).chunk(2, dim=-1)
            x = x + F.rms_norm(ln.down(_gelu_tanh(gate) * up), (D,), lw.post_mlp_norm, eps)
        return x.view(1, 1, D)


def _repeat_kv(rows: torch.Tensor, groups: int) -> torch.Tensor:
    """``(L, kv_heads, head_dim)`` cache rows → ``(1, heads, L, head_dim)``, as HF's ``repeat_kv``."""
    x = rows.transpose(0, 1)[None]
    if groups == 1:
        return x
    b, kvh, L, hd = x.shape
    return x[:, :, None, :, :].expand(b, kvh, groups, L, hd).reshape(b, kvh * groups, L, hd)


CALIBRATION_TOKENS = 256
CALIBRATION_SEED = 0


def calibrate(cfg: ModelConfig, weights: Weights) -> Calibration:
    """Per-channel largest inputs of every product (and the LM head) over one float32
    prefill of a fixed pseudo-random token sequence, for ``int8``. Outlier channels are a
    property of the weights (they appear on any text, strongest on the first token), so no
    corpus or tokenizer is needed, and the result is the same on every load."""
    ref = Llama(cfg, weights, decode="torch")
    recorders = [[AbsMaxLinear(t) for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)] for lw in weights.layers]
    head = AbsMaxLinear(weights.lm_head)
    ref.lin = [LayerLinears(*layer) for layer in recorders]
    ref.head = head
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    n = min(CALIBRATION_TOKENS, cfg.max_position_embeddings)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=g)
    ref.forward(ids, ref.new_cache(n), all_logits=True)
    return [[r.absmax for r in layer] for layer in recorders], head.absmax
