"""Shared helpers for kernel tests: tiny random Llama configs, token ids, the HF oracle and the
never-saw witness of an eviction."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from fak.kernel.kv.ledger import Segment
from fak.kernel.kv.session import Session
from fak.kernel.model.config import ModelConfig, RopeScaling
from fak.kernel.model.llama import Llama
from fak.kernel.model.weights import random_weights, state_dict_from_weights

TINY = dict(
    vocab_size=257,
    hidden_size=64,
    intermediate_size=128,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)

LLAMA3 = RopeScaling(
    kind="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
)


def tiny_config(**overrides) -> ModelConfig:
    return ModelConfig(**(TINY | overrides))


def tiny_model(seed: int = 0, attention: str = "sdpa", decode: str = "auto", **overrides) -> Llama:
    cfg = tiny_config(**overrides)
    return Llama(cfg, random_weights(cfg, seed=seed), model_id=f"tiny-{seed}", attention=attention, decode=decode)


def ids(n: int, seed: int) -> list[int]:
    """``n`` random token ids of the tiny vocabulary, the same for the same seed."""
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_same_state(a: Session, b: Session) -> None:
    """The same cache length, fingerprint and raw key rows, bit for bit."""
    n = a.cache.length
    assert n == b.cache.length
    assert a.fingerprint() == b.fingerprint()
    assert torch.equal(a.cache.kraw[:, :n], b.cache.kraw[:, :n])


def poisoned_in_the_middle(model: Llama, chunk_size: int) -> tuple[Session, Segment, list[tuple[str, list[int]]]]:
    """A session that read system A, a poisoned tool result B (with a ref), user C and tool D (D
    attends to B); B's segment; and the parts a session that never saw B reads: A, C, D."""
    a, b, c, d = ids(17, 4), ids(23, 5), ids(11, 6), ids(14, 7)
    seen = Session(model, chunk_size=chunk_size)
    seen.append("system", tokens=a)
    poison = seen.append("tool", tokens=b, ref="blake3k:" + "cd" * 32)
    seen.append("user", tokens=c)
    seen.append("tool", tokens=d)
    return seen, poison, [("system", a), ("user", c), ("tool", d)]


def assert_never_saw(seen: Session, parts: Iterable[tuple[str, list[int]]], **options) -> Session:
    """The witness of an eviction: a session (``options``) that only ever read ``parts``
    ((kind, tokens), in order) has ``seen``'s last logits and state, bit for bit. Returns it."""
    never = Session(seen.model, **options)
    for kind, tokens in parts:
        never.append(kind, tokens=tokens)
    assert torch.equal(seen.last_logits, never.last_logits)
    assert_same_state(seen, never)
    return never


def hf_oracle(model: Llama):
    """transformers' model of the config's family (``LlamaForCausalLM``, ``MistralForCausalLM``,
    ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``), eager float32, holding the same weights."""
    import transformers

    hf_dict = model.cfg.to_hf()
    hf_cfg = transformers.AutoConfig.for_model(**hf_dict, attn_implementation="eager")
    hf = getattr(transformers, hf_dict["architectures"][0])(hf_cfg).eval()
    sd = {k: v.clone() for k, v in state_dict_from_weights(model.cfg, model.w).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if model.cfg.tie_word_embeddings:
        hf.tie_weights()
    return hf


def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids]), use_cache=False).logits[0]
