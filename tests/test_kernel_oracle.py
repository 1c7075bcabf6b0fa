"""The forward pass against the HF transformers oracle (tiny random models).

Words as in DESIGN.md: oracle-exact = max|Δlogits| = 0 against transformers
eager float32; oracle-close = max|Δlogits| ≤ 1e-4 and the same argmax everywhere.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import LLAMA3, hf_logits, hf_oracle, tiny_model

from fak.kernel.generate import SamplingParams, generate

CONFIGS = {
    "gqa_tied": {},
    "mha_untied": dict(num_kv_heads=4, tie_word_embeddings=False),
    "gqa_llama3_rope": dict(rope_scaling=LLAMA3, rope_theta=500000.0),
    "mqa_untied": dict(num_kv_heads=1, tie_word_embeddings=False),
}


def _ids(n: int, vocab: int = 257, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def assert_oracle_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("name", CONFIGS)
def test_oracle_tiny_full_sequence_exact(name: str) -> None:
    model = tiny_model(attention="eager", **CONFIGS[name])
    ids = _ids(96)
    ours = model.forward(ids, model.new_cache(), all_logits=True)
    ref = hf_logits(hf_oracle(model), ids)
    assert (ours - ref).abs().max().item() == 0.0


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_oracle_tiny_chunked_and_decode_close(name: str, attention: str) -> None:
    model = tiny_model(attention=attention, **CONFIGS[name])
    ids = _ids(80)
    ref = hf_logits(hf_oracle(model), ids)
    cache = model.new_cache(capacity=8)  # forces several growths on the way
    parts = [model.forward(ids[:33], cache, all_logits=True), model.forward(ids[33:60], cache, all_logits=True)]
    parts += [model.forward([t], cache) for t in ids[60:]]
    assert_oracle_close(torch.cat(parts), ref)
    assert cache.length == len(ids) and cache.growths > 0


def test_oracle_tiny_greedy_matches_hf_generate() -> None:
    model = tiny_model()
    hf = hf_oracle(model)
    prompt = _ids(20)
    ours = list(generate(model, model.new_cache(), prompt, SamplingParams(max_tokens=24)))
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
    assert ours == out[0, len(prompt) :].tolist()


def test_mha_fullsequence_sdpa_is_close_not_claimed_exact() -> None:
    """The fast default mode is oracle-close on the full sequence (the exact one is eager)."""
    model = tiny_model(attention="sdpa")
    ids = _ids(64)
    ours = model.forward(ids, model.new_cache(), all_logits=True)
    assert_oracle_close(ours, hf_logits(hf_oracle(model), ids))
