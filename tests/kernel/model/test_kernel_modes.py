"""Weight formats and KV dtypes (``kernel/model/quant.py``): every exactness witness holds
bit-exactly *within* each mode, because each compares the kernel with itself —
write-time eviction, RECOMPUTE, prefix reuse, forget-style replay, decode. Only
float32 is compared with the oracle (tests/kernel/model/test_kernel_oracle.py); for the other
modes the quality gap to float32 is measured on the real model."""

from __future__ import annotations

import pytest
import torch
from support.kernel_helpers import (
    assert_never_saw,
    assert_same_state,
    ids,
    poisoned_in_the_middle,
    tiny_config,
)

from fak.kernel.kv.prefix_cache import PrefixCache, namespace
from fak.kernel.kv.session import EvictMode, PrefixBinding, Session
from fak.kernel.model import blockdot
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.llama import Llama
from fak.kernel.model.loader import load_model
from fak.kernel.model.quant import WEIGHT_FORMATS
from fak.kernel.model.weights import default_model_path, random_weights
from fak.keys import tenant_salt

# (weight format, KV dtype): every format, a bfloat16 KV cache under three of them, a float16 one under gguf
MODES = ([(fmt, None) for fmt in WEIGHT_FORMATS] + [(fmt, torch.bfloat16) for fmt in ("float32", "int8", "gguf")]
         + [("gguf", torch.float16)])
MODE_IDS = [f"{fmt}-kv_{str(kv).removeprefix('torch.') if kv else 'same'}" for fmt, kv in MODES]
MASTER = bytes(range(32))


def mode_model(fmt: str, kv: torch.dtype | None, seed: int = 0) -> Llama:
    cfg = tiny_config()
    return Llama(cfg, random_weights(cfg, seed=seed), model_id=f"tiny-{seed}", weight_format=fmt, kv_dtype=kv)


@pytest.fixture(params=MODES, ids=MODE_IDS)
def mode(request):
    return request.param


def test_mode_is_part_of_the_model_id_and_the_cache_dtype(mode) -> None:
    fmt, kv = mode
    model = mode_model(fmt, kv)
    cache = model.new_cache()
    assert cache.dtype == (kv or torch.float32)
    reference = fmt == "float32" and kv is None
    assert (model.model_id == "tiny-0") is reference  # no prefix cache or ledger mixes two modes' rows
    assert (model.decode == "blas") is reference


def test_write_time_evict_equals_never_saw(mode) -> None:
    model = mode_model(*mode)
    sys_, poison, question = ids(20, 1), ids(33, 2), ids(9, 3)
    seen = Session(model)
    seen.append("system", tokens=sys_)
    tool = seen.append("tool", tokens=poison, ref="blake3k:" + "ab" * 32)
    assert seen.evict([tool.id]).exactness == "bit-exact"
    seen.append("user", tokens=question)
    assert_never_saw(seen, [("system", sys_), ("user", question)])


@pytest.mark.parametrize("chunk_size", [512, 7])
def test_recompute_equals_never_saw(mode, chunk_size: int) -> None:
    model = mode_model(*mode)
    seen, poison, clean = poisoned_in_the_middle(model, chunk_size)
    report = seen.evict([poison.id], EvictMode.RECOMPUTE)
    assert report.exactness == "bit-exact"
    never = assert_never_saw(seen, clean, chunk_size=chunk_size)
    params = SamplingParams(max_tokens=10)  # decoding on from both continues identically
    assert list(generate(model, seen.cache, ids(3, 8), params)) == list(generate(model, never.cache, ids(3, 8), params))
    assert_same_state(seen, never)


def test_prefix_reuse_is_bit_exact(mode) -> None:
    model = mode_model(*mode)
    pc = PrefixCache()
    ns = namespace(tenant_salt(MASTER, "acme"), model.model_id)
    sys_, user, tool, tool2, q = ids(40, 1), ids(12, 2), ids(30, 3), ids(25, 4), ids(8, 5)
    first = Session(model, prefix=PrefixBinding(pc, ns), chunk_size=16)
    for kind, t in (("system", sys_), ("user", user), ("tool", tool)):
        first.append(kind, tokens=t)
    second = Session(model, prefix=PrefixBinding(pc, ns), chunk_size=16)
    plain = Session(model, chunk_size=16)
    for s in (second, plain):
        for kind, t in (("system", sys_), ("user", user), ("tool", tool2), ("user", q)):
            s.append(kind, tokens=t)
    assert second.prefix_hit_tokens == len(sys_) + len(user)
    assert second.fingerprint() == plain.fingerprint()
    assert torch.equal(second.last_logits, plain.last_logits)


def test_decode_repeats_to_the_byte(mode) -> None:
    model = mode_model(*mode)
    runs = []
    for _ in range(2):
        cache = model.new_cache()
        tokens = list(generate(model, cache, ids(21, 9), SamplingParams(max_tokens=16, min_tokens=16)))
        runs.append((tokens, cache.fingerprint(), model.forward([tokens[-1]], cache)))
    assert runs[0][:2] == runs[1][:2]
    assert torch.equal(runs[0][2], runs[1][2])


@pytest.mark.parametrize("fmt", [f for f in WEIGHT_FORMATS if f != "float32"])
def test_forget_style_replay_is_bit_exact(tiny_dir, fmt: str) -> None:
    """What ``Kernel.forget`` checks per session: after the ref's segment (RECOMPUTE) and the
    turn generated while it was live are dropped, the cache equals an independent replay."""
    lm = load_model(tiny_dir, weight_format=fmt)
    s = Session(lm.model, lm.tokenizer, chunk_size=16)
    s.append("system", "You are a travel assistant.")
    tool = s.append("tool", "Flight LH123 is on time, gate B22.", ref="blake3k:" + "ef" * 32)
    s.append("user", "Is my flight on time?")
    list(s.generate(SamplingParams(max_tokens=8, min_tokens=8)))
    assistant = s.ledger.segments[-1]
    assert tool.ref in assistant.content
    s.append("user", "Thanks. And the weather?")
    s.evict([tool.id, assistant.id])
    assert tool.ref not in s.refs()
    assert s.fingerprint() == s.replay_fingerprint()


# --- the real model: quality gap to float32 ----------------------------------------

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one paragraph.",
    "List three prime numbers greater than 100.",
]


def quality_gap(reference: Llama, model: Llama, tokenizer, prompts: list[str], steps: bool = False) -> tuple[float, float]:  # noqa: ANN001
    """Teacher-forced over each prompt: argmax agreement and mean KL(p_float32 ‖ p_mode),
    the mode's logits from one prefill, or with ``steps`` one token per call (decode)."""
    match = total = 0
    kls = []
    for p in prompts:
        prompt = tokenizer.encode(tokenizer.render([{"role": "user", "content": p}], True))
        a = reference.forward(prompt, reference.new_cache(), all_logits=True).log_softmax(-1)
        if steps:
            cache = model.new_cache(len(prompt) + 1)
            b = torch.cat([model.forward([t], cache) for t in prompt]).log_softmax(-1)
        else:
            b = model.forward(prompt, model.new_cache(), all_logits=True).log_softmax(-1)
        kls.append((a.exp() * (a - b)).sum(-1))
        match += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += len(prompt)
    return match / total, float(torch.cat(kls).mean())


@pytest.mark.real_model
def test_quality_gap_to_float32_smollm2(smollm2) -> None:
    ref = smollm2.model
    gaps = {}
    blocks = blockdot.gguf_blocks(default_model_path(), ref.cfg)
    for fmt in ("float16", "int8", "gguf"):
        model = Llama(ref.cfg, ref.w, model_id=ref.model_id, weight_format=fmt, blocks=blocks if fmt == "gguf" else None)
        gaps[fmt] = quality_gap(ref, model, smollm2.tokenizer, PROMPTS, steps=fmt == "gguf")
    # the serving default: its decode steps read the file's own blocks (exactly the
    # reference's weights) with ~15-bit inputs (measured: argmax 1.000, KL 9e-7 over the
    # eight-prompt set); its prefill is float32's own products over the same weights
    assert gaps["gguf"][0] >= 0.98 and gaps["gguf"][1] < 1e-4, gaps
    # float16 weights with float32 activations: argmax next to float32's
    assert gaps["float16"][0] >= 0.98 and gaps["float16"][1] < 1e-3, gaps
    # int8 (activations quantised too) is approximate: measured 0.87 / KL 0.05 here; a floor
    # against regressions (without SmoothQuant and per-row scales it was 0.37 / KL 1.9)
    assert gaps["int8"][0] >= 0.75 and gaps["int8"][1] < 0.2, gaps


@pytest.mark.parametrize(("fmt", "kv"), [("int8", "float32"), ("gguf", "float32"), ("gguf", "bfloat16"),
                                         ("gguf", "float16")])
def test_kernel_serves_the_settings_weights_and_forget_stays_exact(tiny_dir, tmp_path, monkeypatch, fmt: str,
                                                                   kv: str) -> None:
    """Through the façade: ``Settings.weights`` picks the mode (the suite pins float32 in
    conftest; the serving default is gguf where a C compiler and AVX2 are), and a forget's receipt holds the same
    fingerprint-equals-replay witness in it."""
    from fak import Kernel, Settings

    monkeypatch.delenv("FAK_WEIGHTS")
    from fak.kernel.model.quant import fbgemm_supported

    default = "gguf" if blockdot.fast_path_possible() else ("float16" if fbgemm_supported() else "float32")
    assert Settings().weights is None and blockdot.default_weights() == default  # the serving default
    assert Settings().kv_dtype == "float32"
    settings = Settings(data_dir=tmp_path / "data", model_path=tiny_dir, chunk_size=16, weights=fmt, kv_dtype=kv)
    with Kernel.open(settings, progress=None) as k:
        assert k.model.weight_format == fmt and k.model.kv_dtype == getattr(torch, kv)
        suffix = "+int8" if fmt == "int8" else "+gguf-q8_0"  # an HF folder has no GGUF blocks: Q8_0 of its floats
        assert k.model_id.endswith(suffix + ("" if kv == "float32" else "+kv-" + kv))
        s = k.session("acme")
        s.append("system", "You are a travel assistant.")
        ref = s.admit("flight_status", b"LH123 is on time, gate B22.").ref
        s.append("user", "Is my flight on time?")
        assert len(list(s.generate(max_tokens=6, min_tokens=6))) == 6  # decode steps of the mode, the ref live
        receipt = k.forget("acme", ref, requested_by="dpo", reason="test", wait_replay=True)
        assert receipt.replay == "verified"  # each session's replay equals its fingerprint after the drop
        assert ref not in s.refs() and s.fingerprint() == s.replay_fingerprint()
