"""Model hyper-parameters of the decoder families fak runs (Llama, Mistral, Qwen2, Qwen3,
Gemma 3), read from GGUF metadata or an HF ``config.json``.

The families share one forward (``llama.py``); ``arch`` (the HF ``model_type``) decides
where they differ: ``attention_bias`` (biases on the q/k/v projections, none on the
output: Qwen2), ``qk_norm`` (an RMSNorm over each query and key head before RoPE: Qwen3)
and ``gguf_permuted`` (how a GGUF file orders the Q/K rows); Mistral's ``sliding_window``
limits how far back a query attends, in every path. Gemma 3 (``gemma3``) differs in more
places: a scaled embedding, four RMSNorms per layer, GeGLU, q/k norms, an attention scale of
its own (``query_pre_attn_scalar``) and local layers (a sliding window and a RoPE base of their
own) interleaved with global ones (``layer_local``). A config field whose computation fak
does not run exactly (Qwen's per-layer sliding windows, MLP or output biases, other RoPE
scalings, MoE) is refused by name, never run approximately."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fak.errors import FakError


class ModelError(FakError):
    """The model file is missing, unreadable or not of a supported architecture."""

    code = "model_error"
    status = 500


class TemplateRefused(ModelError, code="chat_template_refused", status=400):
    """The model's own chat template refuses these messages (its ``raise_exception``: e.g.
    Llama 3's "only supports single tool-calls at once"): the request's fault, not the server's."""


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is ``default`` or ``llama3``."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma3")
HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
GEMMA3_LOCAL_ROPE_THETA = 10000.0  # Gemma 3's local layers (llama.cpp and transformers both fix it)
GEMMA3_PATTERN = 6  # Gemma 3: five local layers, then one global (llama.cpp's set_swa_pattern(6))


def refuse(arch: str, field_name: str, value: Any, why: str) -> ModelError:
    """The error for a config field fak cannot run exactly: it names the field and its value."""
    return ModelError(f"{arch} config field {field_name}={value!r} is not supported: {why}")


def _check_hf_fields(arch: str, cfg: dict[str, Any]) -> None:
    """Refuse every field of an HF config whose computation this forward does not run exactly."""
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise refuse(arch, "hidden_act", act, "fak's MLP is SwiGLU with silu")
    if cfg.get("mlp_bias"):
        raise refuse(arch, "mlp_bias", cfg["mlp_bias"], "fak's MLP products have no biases")
    if arch != "qwen2" and cfg.get("attention_bias"):  # llama, mistral and qwen3 would add an output bias too
        raise refuse(arch, "attention_bias", cfg["attention_bias"], "fak's attention output product has no bias")
    if arch in ("qwen2", "qwen3"):
        if cfg.get("use_sliding_window"):
            raise refuse(arch, "use_sliding_window", cfg["use_sliding_window"],
                         "sliding-window layers are not computed; only full attention")
        types = cfg.get("layer_types") or []
        if any(t != "full_attention" for t in types):
            raise refuse(arch, "layer_types", sorted(set(types)), "only full_attention layers are computed")
    elif arch == "mistral":
        window = cfg.get("sliding_window")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise refuse(arch, "sliding_window", window, "a window is a positive number of positions")
    if cfg.get("num_experts") or cfg.get("num_local_experts"):
        raise refuse(arch, "num_experts", cfg.get("num_experts") or cfg.get("num_local_experts"),
                     "mixture-of-experts layers are not computed")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    name: str = "llama"
    arch: str = "llama"  # the HF model_type; it decides the two switches below
    sliding_window: int | None = None  # Mistral: a query attends to keys less than this many positions back
    # Gemma 3 only: every ``sliding_window_pattern``-th layer is global, the others local (windowed,
    # RoPE base ``rope_local_theta``); scores scaled by ``query_pre_attn_scalar ** -0.5``; logits
    # soft-capped (``cap * tanh(logits / cap)``) where ``final_logit_softcapping`` is set
    sliding_window_pattern: int | None = None
    rope_local_theta: float | None = None
    query_pre_attn_scalar: int | None = None
    final_logit_softcapping: float | None = None

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ModelError(f"unsupported architecture {self.arch!r} (model_type; supported: {', '.join(ARCHS)})")
        if self.sliding_window is not None and (self.arch not in ("mistral", "gemma3") or self.sliding_window < 1):
            raise refuse(self.arch, "sliding_window", self.sliding_window,
                         "fak computes a window for mistral and gemma3 only")
        gemma_fields = {"sliding_window_pattern": self.sliding_window_pattern, "rope_local_theta": self.rope_local_theta,
                        "query_pre_attn_scalar": self.query_pre_attn_scalar,
                        "final_logit_softcapping": self.final_logit_softcapping}
        for name, value in gemma_fields.items():
            if value is not None and self.arch != "gemma3":
                raise refuse(self.arch, name, value, "a Gemma 3 field")
        if self.arch == "gemma3" and (self.sliding_window is None or self.sliding_window_pattern is None
                                      or self.sliding_window_pattern < 1 or self.rope_local_theta is None):
            raise ModelError("a gemma3 config needs sliding_window, sliding_window_pattern and rope_local_theta")
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ModelError(f"head_dim={self.head_dim} must be even for RoPE")

    @property
    def attention_bias(self) -> bool:
        """Biases on the q, k and v projections (none on the output): Qwen2."""
        return self.arch == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """An RMSNorm over each query and key head after the projection, before RoPE: Qwen3, Gemma 3."""
        return self.arch in ("qwen3", "gemma3")

    @property
    def gemma(self) -> bool:
        """Gemma 3's layer (``llama.py``'s ``_gemma_*`` paths): scaled embedding, pre- and
        post-norms around attention and MLP, GeGLU, local and global layers."""
        return self.arch == "gemma3"

    def layer_local(self, layer: int) -> bool:
        """Whether ``layer`` is one of Gemma 3's local (sliding-window) layers; False elsewhere
        (Mistral's window is the model's, ``sliding_window``, on every layer)."""
        p = self.sliding_window_pattern
        return p is not None and (layer + 1) % p != 0

    @property
    def attention_scale(self) -> float:
        """What attention scores are multiplied by: ``head_dim ** -0.5``, Gemma 3's ``query_pre_attn_scalar ** -0.5``."""
        scale: float = (self.query_pre_attn_scalar if self.query_pre_attn_scalar is not None else self.head_dim) ** -0.5
        return scale  # the power as transformers computes it (scaling = query_pre_attn_scalar**-0.5)

    @property
    def gguf_permuted(self) -> bool:
        """Whether llama.cpp's converter stores this family's Q/K rows rotary-permuted (its
        ``llama`` architecture, which Mistral converts to; Qwen's use the halves order as HF)."""
        return self.arch in ("llama", "mistral")

    def window_start(self, position: int) -> int:
        """The first key position a query at ``position`` attends to (as transformers' sliding
        window mask: key > query - window); 0 without a window. (Gemma 3: a local layer's.)"""
        return 0 if self.sliding_window is None else max(0, position - self.sliding_window + 1)

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, element_size: int = 4) -> int:
        """Bytes of K, Kraw and V per token over all layers."""
        return 3 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        data = dict(data)
        data["rope_scaling"] = RopeScaling(**data.get("rope_scaling") or {})
        return cls(**data)

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From an HF ``config.json`` of a Llama, Mistral, Qwen2 or Qwen3 model."""
        arch = cfg.get("model_type", "")
        if arch not in ARCHS:
            raise ModelError(f"unsupported architecture {arch!r} (model_type; supported: {', '.join(ARCHS)})")
        _check_hf_fields(arch, cfg)
        num_heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
        if rope_type not in ("default", "llama3"):
            raise refuse(arch, "rope_scaling", rope_type, "supported RoPE scalings: default, llama3")
        scaling = RopeScaling()
        if rope_type == "llama3":
            scaling = RopeScaling(
                kind="llama3",
                factor=float(rope["factor"]),
                low_freq_factor=float(rope["low_freq_factor"]),
                high_freq_factor=float(rope["high_freq_factor"]),
                original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
            )
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope_scaling=scaling,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            name=cfg.get("_name_or_path") or arch or "llama",
            arch=arch,
            sliding_window=cfg.get("sliding_window") if arch == "mistral" else None,
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF config dict of this family (``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``,
        ``Qwen3Config``, ``Gemma3TextConfig``) with the same hyper-parameters (for the oracle)."""
        out: dict[str, Any] = {
            "model_type": self.arch,
            "architectures": [HF_CLASSES[self.arch]],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
        }
        if self.arch == "mistral":
            out["sliding_window"] = self.sliding_window
        if self.arch in ("qwen2", "qwen3"):
            out |= {"use_sliding_window": False, "sliding_window": None,
                    "layer_types": ["full_attention"] * self.num_layers}
        if self.arch == "gemma3":  # transformers' text-only Gemma 3 (Gemma3TextConfig)
            pattern = self.sliding_window_pattern or GEMMA3_PATTERN
            out |= {"model_type": "gemma3_text", "hidden_activation": "gelu_pytorch_tanh",
                    "sliding_window": self.sliding_window,
                    "layer_types": ["sliding_attention" if self.layer_local(i) else "full_attention"
                                    for i in range(self.num_layers)],
                    "rope_parameters": {
                        "full_attention": {"rope_type": "default", "rope_theta": self.rope_theta},
                        "sliding_attention": {"rope_type": "default", "rope_theta": self.rope_local_theta},
                    },
                    "sliding_window_pattern": pattern,
                    "query_pre_attn_scalar": self.query_pre_attn_scalar or self.head_dim,
                    "final_logit_softcapping": self.final_logit_softcapping, "attn_logit_softcapping": None,
                    "use_bidirectional_attention": False}
            del out["hidden_act"]
            del out["rope_theta"]
        if self.rope_scaling.kind == "llama3":
            s = self.rope_scaling
            out["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
        return out
