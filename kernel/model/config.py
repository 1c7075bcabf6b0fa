"""Model hyper-parameters for the Llama family, read from GGUF metadata or an
HF ``config.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fak.errors import FakError


class ModelError(FakError):
    """The model file is missing, unreadable or not of a supported architecture."""

    code = "model_error"
    status = 500


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``kind`` is ``default`` or ``llama3``."""

    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ModelError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ModelError(f"head_dim={self.head_dim} must be even for RoPE")

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
        """From an HF ``config.json`` of a Llama-family model."""
        arch = cfg.get("model_type", "")
        # qwen2 (q/k/v biases) and mistral (sliding window) differ in ways this forward does not compute
        if arch != "llama":
            raise ModelError(f"unsupported architecture {arch!r}: fak runs Llama-family models")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ModelError("attention or MLP biases are not supported")
        num_heads = cfg["num_attention_heads"]
        rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default")) if rope else "default"
        if rope_type not in ("default", "llama3"):
            raise ModelError(f"unsupported RoPE scaling {rope_type!r} (supported: default, llama3)")
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
        )

    def to_hf(self) -> dict[str, Any]:
        """An HF ``LlamaConfig`` dict with the same hyper-parameters (for the oracle)."""
        out: dict[str, Any] = {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
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
