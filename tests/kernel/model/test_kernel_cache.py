"""KV cache: growth, reuse and fingerprints (tiny random model)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kernel_helpers import tiny_model

from fak.kernel.model.generate import SamplingParams, _nucleus, generate, sample
from fak.kernel.model.kv_cache import KVCache


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_prefix_reuse_matches_recompute() -> None:
    """[A] then [B] against A's cache: bit-exact to a second run making the same calls,
    and oracle-close to one prefill of A+B."""
    model = tiny_model()
    a, b = _ids(40, 1), _ids(25, 2)

    def run() -> tuple[torch.Tensor, KVCache]:
        cache = model.new_cache()
        model.forward(a, cache)
        return model.forward(b, cache, all_logits=True), cache

    l1, c1 = run()
    # the second run reuses A's KV from a detached copy (what the prefix cache serves)
    base = model.new_cache()
    model.forward(a, base)
    c2 = model.new_cache()
    c2.extend(base.export(0, base.length))
    l2 = model.forward(b, c2, all_logits=True)
    assert torch.equal(l1, l2)
    assert c1.fingerprint() == c2.fingerprint()
    assert torch.equal(c1.kraw[:, : c1.length], c2.kraw[:, : c2.length])

    whole = model.new_cache()
    lw = model.forward(a + b, whole, all_logits=True)[len(a) :]
    assert (lw - l1).abs().max().item() <= 1e-4
    assert torch.equal(lw.argmax(-1), l1.argmax(-1))


def test_kv_growth_keeps_contents() -> None:
    model = tiny_model()
    ids = _ids(150, 3)
    small = model.new_cache(capacity=4)
    big = model.new_cache(capacity=512)
    for chunk in (ids[:10], ids[10:70], ids[70:71], ids[71:]):
        ls, lb = model.forward(chunk, small), model.forward(chunk, big)
        assert torch.equal(ls, lb)  # capacity never changes the computed bytes
    assert small.growths >= 3 and big.growths == 0
    assert small.fingerprint() == big.fingerprint()
    assert small.token_list() == ids
    assert small.positions[: small.length].tolist() == list(range(150))


def test_kv_fingerprint_sensitive_and_stable() -> None:
    model = tiny_model()
    cache = model.new_cache()
    model.forward(_ids(30, 4), cache)
    fp = cache.fingerprint()
    assert fp.startswith("blake3:") and len(fp) == 7 + 64
    cache.reserve(cache.capacity * 4)
    assert cache.fingerprint() == fp  # growth does not change identity
    cache.v[1, 5, 0, 3] += 1e-6
    assert cache.fingerprint() != fp


def test_truncate_zeroes_dropped_rows() -> None:
    model = tiny_model()
    cache = model.new_cache()
    model.forward(_ids(30, 5), cache)
    cache.truncate(12)
    assert cache.length == 12
    assert cache.k[:, 12:].abs().sum() == 0 and cache.kraw[:, 12:].abs().sum() == 0
    assert cache.v[:, 12:].abs().sum() == 0 and cache.tokens[12:].abs().sum() == 0


def test_kv_byte_accounting() -> None:
    model = tiny_model()
    cache = model.new_cache(capacity=100)
    model.forward(_ids(10, 6), cache)
    cfg = model.cfg
    per_token = 3 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 + 16
    assert cache.bytes_per_token == per_token
    assert cache.nbytes_live == 10 * per_token
    assert cache.nbytes_allocated == 100 * per_token


def test_sampling_is_seeded_and_respects_stops() -> None:
    model = tiny_model()
    prompt = _ids(12, 7)
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.8, seed=42)
    a = list(generate(model, model.new_cache(), prompt, params))
    b = list(generate(model, model.new_cache(), prompt, params))
    assert a == b and len(a) == 16
    stop = a[3]
    c = list(generate(model, model.new_cache(), prompt, SamplingParams(**{**params.__dict__, "stop_token_ids": frozenset({stop})})))
    assert c[-1] == stop and len(c) == a.index(stop) + 1


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = np.array([10.0, 9.0, -5.0, -6.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    picks = {sample(logits, SamplingParams(temperature=1.0, top_p=0.5), rng) for _ in range(50)}
    assert picks == {0}
    picks = {sample(logits, SamplingParams(temperature=1.0, top_p=0.9), rng) for _ in range(200)}
    assert picks == {0, 1}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=300),
    st.floats(0.01, 0.999),
)
def test_nucleus_equals_the_prefix_of_a_full_stable_sort(levels: list[int], top_p: float) -> None:
    """Partitioned nucleus == the definition on a full sort, ties included (few distinct values)."""
    probs = np.exp(np.array(levels, dtype=np.float64))
    probs /= probs.sum()
    order = np.lexsort((np.arange(len(probs)), -probs))
    keep = np.cumsum(probs[order]) - probs[order] < top_p
    assert _nucleus(probs, top_p).tolist() == order[keep].tolist()


def test_sampling_follows_the_distribution() -> None:
    """Temperature sampling draws each token about as often as its softmax probability."""
    logits = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    rng = np.random.default_rng(1)
    draws = np.bincount([sample(logits, SamplingParams(temperature=1.0), rng) for _ in range(4000)], minlength=3)
    assert np.allclose(draws / 4000, [0.5, 0.3, 0.2], atol=0.03)


def test_min_tokens_masks_stop_tokens() -> None:
    model = tiny_model()
    prompt = _ids(12, 7)
    free = list(generate(model, model.new_cache(), prompt, SamplingParams(max_tokens=10)))
    stop = free[2]
    held = list(
        generate(
            model,
            model.new_cache(),
            prompt,
            SamplingParams(max_tokens=10, min_tokens=10, stop_token_ids=frozenset({stop})),
        )
    )
    assert len(held) == 10 and stop not in held


def test_last_row_prefill_writes_the_same_cache() -> None:
    """Without ``all_logits`` the last layer runs only the last row past its keys and
    values: the cache is the same bytes, the last logits are close to the full run's."""
    model = tiny_model()
    a, b = _ids(30, 8), _ids(20, 9)
    full, last = model.new_cache(), model.new_cache()
    for chunk in (a, b):  # a first chunk (causal) and a later one (masked)
        lf = model.forward(chunk, full, all_logits=True)
        ll = model.forward(chunk, last)
        assert ll.shape == (1, model.cfg.vocab_size)
        assert (ll[0] - lf[-1]).abs().max().item() <= 1e-5 and int(ll.argmax()) == int(lf[-1].argmax())
    assert full.fingerprint() == last.fingerprint()
