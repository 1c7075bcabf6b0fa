"""The forward pass against the HF transformers oracle (tiny random models).

Words as in docs/design.md: oracle-exact = max|Δlogits| = 0 against transformers
eager float32; oracle-close = max|Δlogits| ≤ 1e-4 and the same argmax everywhere.
"""

from __future__ import annotations

import pytest
import torch
from support.kernel_helpers import LLAMA3, hf_logits, hf_oracle, tiny_model

from fak.kernel.model.generate import SamplingParams, generate

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
@pytest.mark.parametrize(("attention", "decode"), [("eager", "blas"), ("sdpa", "blas"), ("sdpa", "torch")])
def test_oracle_tiny_chunked_and_decode_close(name: str, attention: str, decode: str) -> None:
    model = tiny_model(attention=attention, decode=decode, **CONFIGS[name])
    ids = _ids(80)
    ref = hf_logits(hf_oracle(model), ids)
    cache = model.new_cache(capacity=8)  # forces several growths on the way
    parts = [model.forward(ids[:33], cache, all_logits=True), model.forward(ids[33:60], cache, all_logits=True)]
    parts += [model.forward([t], cache) for t in ids[60:]]
    assert_oracle_close(torch.cat(parts), ref)
    assert cache.length == len(ids) and cache.growths > 0


@pytest.mark.parametrize("decode", ["blas", "torch"])
def test_oracle_tiny_greedy_matches_hf_generate(decode: str) -> None:
    model = tiny_model(decode=decode)
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


def test_blas_decode_is_bit_exact_between_runs_and_close_to_torch_decode() -> None:
    """The numpy/OpenBLAS decode step repeats to the byte; it is close to (not the
    same bytes as) the torch decode step, which is why a model keeps one backend."""
    blas, torch_path = tiny_model(decode="blas"), tiny_model(decode="torch")
    assert (blas.decode, torch_path.decode) == ("blas", "torch")
    ids = _ids(40)

    def run(model) -> tuple[torch.Tensor, str]:  # noqa: ANN001
        cache = model.new_cache(capacity=8)
        model.forward(ids[:20], cache)
        logits = torch.cat([model.forward([t], cache) for t in ids[20:]])
        return logits, cache.fingerprint()

    (l1, f1), (l2, f2), (l3, f3) = run(blas), run(blas), run(torch_path)
    assert torch.equal(l1, l2) and f1 == f2
    assert_oracle_close(l1, l3)
    assert f1 != f3


def test_decode_backend_choice() -> None:
    """auto = blas on CPU float32, torch elsewhere; blas refuses what numpy cannot run."""
    from fak.kernel.model.llama import Llama
    from fak.kernel.model.loader import move_weights

    model = tiny_model()
    assert model.decode == "blas"
    bf16 = move_weights(model.w, torch.device("cpu"), torch.bfloat16)
    assert model.w.layers[0].wqkv.dtype == torch.float32  # converting made new weights
    assert Llama(model.cfg, bf16).decode == "torch"
    with pytest.raises(ValueError, match="CPU float32"):
        Llama(model.cfg, bf16, decode="blas")
    with pytest.raises(ValueError, match="decode must be one of"):
        tiny_model(decode="fast")
