"""The model on a device (``Settings.device``, ``FAK_DEVICE``; ``kernel/model/device.py``).

On every machine: the setting's validation, the clear refusal of a CUDA device where torch
sees no CUDA (at ``Kernel.open``, at ``load_model``), the formats refused on a GPU, the cuBLAS
variable set before CUDA starts, and the plumbing: a model built with ``device="cpu"`` named
gives the bytes of the default.

Marked ``gpu`` (``pytest -m gpu``; ``bench/gpu_check.sh`` runs them with the benchmark; each also carries ``needs_cuda``): the
exactness claims on CUDA, with tiny random models of each family against transformers on the
same GPU: oracle-close (max|Δlogits| ≤ 1e-4, same argmax), greedy tokens equal to
``generate()``, write-time eviction and RECOMPUTE bit-exact to a session that never saw the
span, prefix reuse bit-exact, repeat runs bit-exact (determinism), fingerprints of device
caches equal to those of the same rows on the host; and a Kernel session with the real
SmolLM2 on CUDA (also ``real_model``). Without CUDA they skip, saying so.
"""

from __future__ import annotations

import pytest
import torch
from support.kernel_helpers import (
    LLAMA3,
    assert_never_saw,
    hf_oracle,
    ids,
    poisoned_in_the_middle,
    tiny_config,
)

from fak import Kernel, Settings
from fak.kernel.kv.prefix_cache import PrefixCache, namespace
from fak.kernel.kv.session import EvictMode, PrefixBinding, Session
from fak.kernel.model import device as devices
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.kv_cache import KVBlock, KVCache
from fak.kernel.model.llama import Llama
from fak.kernel.model.loader import load_model, move_weights
from fak.kernel.model.weights import random_weights
from fak.keys import tenant_salt
from fak.settings import CUBLAS_WORKSPACE, SettingsError, prepare_cuda_environment

HAS_CUDA = torch.cuda.is_available()
NO_CUDA = ("no CUDA device here (torch.cuda.is_available() is False: "
           f"{'a CPU-only torch build' if torch.version.cuda is None else 'no GPU visible'}); "
           "run `pytest -m gpu` or bench/gpu_check.sh on a GPU machine")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)

# the families of tests/kernel/model/test_model_families.py, plus the Llama 2-style default of the tiny config
FAMILIES: dict[str, dict] = {
    "llama": {},
    "qwen2": dict(arch="qwen2", num_kv_heads=2, tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": dict(arch="qwen3", num_kv_heads=2, head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0),
    "mistral": dict(arch="mistral", num_kv_heads=1, tie_word_embeddings=False, sliding_window=12),
    "llama3": dict(arch="llama", num_kv_heads=2, rope_scaling=LLAMA3, rope_theta=500000.0),
}


def model_on(device: str, family: str = "llama", attention: str = "sdpa", decode: str = "auto", seed: int = 3) -> Llama:
    """A tiny random model of ``family`` with its weights on ``device`` (float32)."""
    cfg = tiny_config(**FAMILIES[family])
    w = move_weights(random_weights(cfg, seed=seed), torch.device(device))
    return Llama(cfg, w, model_id=f"tiny-{family}-{seed}", attention=attention, decode=decode)


def assert_oracle_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert ours.device == ref.device
    assert (ours - ref).abs().max().item() <= 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


# --- every machine: the setting and the plumbing -------------------------------------------------


def test_device_setting_defaults_to_cpu_and_takes_cuda_names(monkeypatch) -> None:
    assert Settings().device == "cpu"
    for name in ("cpu", "cuda", "cuda:0", "cuda:3"):
        assert Settings(device=name).device == name
    monkeypatch.setenv("FAK_DEVICE", "cuda:1")
    assert Settings.load().device == "cuda:1"


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CUDA", "mps", "cuda:0 "])
def test_a_device_that_is_not_cpu_or_cuda_is_refused_naming_the_setting(bad: str) -> None:
    with pytest.raises(SettingsError, match="setting device"):
        Settings.load(device=bad)


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: the refusal is for machines without it")
def test_a_cuda_device_without_cuda_is_a_clear_error_at_kernel_open(settings) -> None:
    s = settings.model_copy(update={"device": "cuda"})
    with pytest.raises(devices.DeviceError, match=r"FAK_DEVICE.*'cuda'.*CUDA is not available"):
        Kernel.open(s, progress=None)
    # refused before the data directory is kept: a CPU kernel opens on it right after
    k = Kernel.open(settings, progress=None)
    try:
        assert k.model.device.type == "cpu"
    finally:
        k.close()


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: the refusal is for machines without it")
def test_a_cuda_device_without_cuda_is_refused_by_load_model(tiny_dir) -> None:
    for name in ("cuda", "cuda:1"):
        with pytest.raises(devices.DeviceError, match="FAK_DEVICE"):
            load_model(tiny_dir, device=name)


def test_cpu_only_weight_formats_are_refused_on_cuda() -> None:
    cuda = torch.device("cuda")  # a name only: nothing runs there
    for fmt in ("gguf", "int8", "float16"):
        with pytest.raises(devices.DeviceError, match=rf"FAK_WEIGHTS.*{fmt}.*CPU only"):
            devices.check_format(cuda, fmt)
    for fmt in ("float32", "bfloat16"):
        devices.check_format(cuda, fmt)
    for fmt in ("gguf", "int8", "float16", "float32", "bfloat16"):
        devices.check_format(torch.device("cpu"), fmt)


def test_resolve_cpu_is_the_cpu_and_other_kinds_are_refused() -> None:
    assert devices.resolve("cpu") == torch.device("cpu")
    assert devices.resolve(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(devices.DeviceError, match="only cpu and cuda"):
        devices.resolve("meta")
    with pytest.raises(devices.DeviceError, match="not a device"):
        devices.resolve("nonsense")


def test_cublas_workspace_is_set_unless_the_operator_set_it(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert prepare_cuda_environment() == CUBLAS_WORKSPACE == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # also deterministic: the operator's choice stays
    assert prepare_cuda_environment() == ":16:8"


def test_a_model_built_on_cpu_by_name_is_the_default_bytes(tiny_dir) -> None:
    default, named = load_model(tiny_dir), load_model(tiny_dir, device="cpu")
    assert named.model.device == torch.device("cpu") and named.model.decode == default.model.decode
    prompt = ids(40, 11)
    a, b = default.model.new_cache(), named.model.new_cache()
    la, lb = default.model.forward(prompt, a, all_logits=True), named.model.forward(prompt, b, all_logits=True)
    assert torch.equal(la, lb)
    for t in ids(6, 12):
        assert torch.equal(default.model.forward([t], a), named.model.forward([t], b))
    assert a.fingerprint() == b.fingerprint()
    assert move_weights(named.model.w, torch.device("cpu")) is named.model.w  # nothing copied


def test_positions_given_as_host_tensors_run_on_the_models_device() -> None:
    """RECOMPUTE and PIC pass positions they built: the forward moves them to its device (on the
    CPU a no-op: the same bytes as positions it makes itself)."""
    model = model_on("cpu")
    prompt = ids(20, 13)
    a, b = model.new_cache(), model.new_cache()
    la = model.forward(prompt, a, all_logits=True)
    lb = model.forward(prompt, b, positions=torch.arange(20), all_logits=True)
    assert torch.equal(la, lb) and a.fingerprint() == b.fingerprint()


# --- CUDA: the exactness suite on the GPU ---------------------------------------------------------


@pytest.fixture(scope="module")
def cuda() -> torch.device:
    return devices.resolve("cuda")  # sets the determinism switches before the first CUDA kernel


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cuda_oracle_close_to_transformers_on_the_same_gpu(cuda, family: str, attention: str) -> None:
    pytest.importorskip("transformers")
    model = model_on("cuda", family, attention=attention)
    assert model.device.type == cuda.type and model.decode == "torch"
    hf = hf_oracle(model_on("cpu", family)).to(cuda)
    prompt = ids(70, 5)
    with torch.inference_mode():
        ref = hf(torch.tensor([prompt], device=cuda), use_cache=False).logits[0]
    assert_oracle_close(model.forward(prompt, model.new_cache(), all_logits=True), ref)
    cache = model.new_cache(capacity=8)  # grows on the way, on the GPU
    parts = [model.forward(prompt[:29], cache, all_logits=True), model.forward(prompt[29:50], cache, all_logits=True)]
    parts += [model.forward([t], cache) for t in prompt[50:]]
    assert_oracle_close(torch.cat(parts), ref)
    assert cache.growths > 0 and cache.k.device.type == cache.positions.device.type == cuda.type


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cuda_greedy_tokens_equal_transformers_generate(cuda, family: str) -> None:
    model = model_on("cuda", family)
    hf = hf_oracle(model_on("cpu", family)).to(cuda)
    prompt = ids(16, 2)
    got = list(generate(model, model.new_cache(), prompt, SamplingParams(max_tokens=16, min_tokens=16)))
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt], device=cuda), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert got == out[0, len(prompt):].tolist()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cuda_write_time_eviction_equals_never_saw(cuda, family: str) -> None:
    model = model_on("cuda", family)
    sys_, poison, question = ids(20, 1), ids(33, 2), ids(9, 3)
    seen = Session(model)
    seen.append("system", tokens=sys_)
    tool = seen.append("tool", tokens=poison, ref="blake3k:" + "ab" * 32)
    report = seen.evict([tool.id])
    assert report.mode is EvictMode.WRITE_TIME and report.exactness == "bit-exact"
    seen.append("user", tokens=question)
    never = assert_never_saw(seen, [("system", sys_), ("user", question)])
    assert never.cache.k.device.type == cuda.type
    control = Session(model)
    for kind, t in (("system", sys_), ("tool", poison), ("user", question)):
        control.append(kind, tokens=t)
    assert (control.last_logits - never.last_logits).abs().max().item() > 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("chunk_size", [512, 7])
def test_cuda_recompute_eviction_equals_never_saw(cuda, family: str, chunk_size: int) -> None:
    model = model_on("cuda", family)
    seen, poison, clean = poisoned_in_the_middle(model, chunk_size)
    report = seen.evict([poison.id], EvictMode.RECOMPUTE)
    assert report.exactness == "bit-exact"
    never = assert_never_saw(seen, clean, chunk_size=chunk_size)
    params = SamplingParams(max_tokens=12)
    assert list(generate(model, seen.cache, ids(3, 8), params)) == list(generate(model, never.cache, ids(3, 8), params))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral"])
def test_cuda_prefix_reuse_is_bit_exact(cuda, family: str) -> None:
    model = model_on("cuda", family)
    pc = PrefixCache()
    bind = PrefixBinding(pc, namespace(tenant_salt(bytes(range(32)), "acme"), model.model_id))
    sys_, user, tool, tool2, q = ids(40, 1), ids(12, 2), ids(30, 3), ids(25, 4), ids(8, 5)
    first = Session(model, prefix=bind, chunk_size=16)
    for kind, t in (("system", sys_), ("user", user), ("tool", tool)):
        first.append(kind, tokens=t)
    second, plain = Session(model, prefix=bind, chunk_size=16), Session(model, chunk_size=16)
    for s in (second, plain):
        for kind, t in (("system", sys_), ("user", user), ("tool", tool2), ("user", q)):
            s.append(kind, tokens=t)
    assert second.prefix_hit_tokens == len(sys_) + len(user)
    assert second.fingerprint() == plain.fingerprint()
    assert torch.equal(second.last_logits, plain.last_logits)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("family", list(FAMILIES))
def test_cuda_repeat_runs_give_identical_bytes(cuda, family: str) -> None:
    """Determinism: two models built alike, the same calls, the same bytes (logits and cache)."""
    runs = []
    for _ in range(2):
        model = model_on("cuda", family)
        cache = model.new_cache()
        logits = [model.forward(ids(57, 9), cache, all_logits=True)]
        logits += [model.forward([t], cache) for t in ids(12, 10)]
        runs.append((torch.cat(logits).cpu(), cache.fingerprint(), cache.kraw[:, : cache.length].cpu()))
    (la, fa, ka), (lb, fb, kb) = runs
    assert torch.equal(la, lb) and fa == fb and torch.equal(ka, kb)


@pytest.mark.gpu
@needs_cuda
def test_cuda_fingerprint_is_of_the_bytes_on_the_host(cuda) -> None:
    """A GPU cache's fingerprint equals that of a host cache holding the same rows: fingerprints
    hash bytes copied to the CPU, so they compare across devices."""
    model = model_on("cuda")
    cache = model.new_cache()
    model.forward(ids(33, 4), cache)
    rows = cache.export(0, cache.length)
    host = KVCache(model.cfg, device="cpu", dtype=cache.dtype)
    host.extend(KVBlock(rows.k.cpu(), rows.kraw.cpu(), rows.v.cpu(), rows.tokens.cpu(), rows.positions.cpu()))
    assert host.fingerprint() == cache.fingerprint()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.real_model
def test_cuda_kernel_session_with_smollm2_admits_evicts_forgets(cuda, tmp_path) -> None:
    """The whole kernel on the GPU with the real model: a tool result admitted in the middle,
    evicted (RECOMPUTE: the bytes of a session that never read it), then forgotten (the
    kernel's own replay verifies every session's fingerprint)."""
    settings = Settings(data_dir=tmp_path / "data", device="cuda", chunk_size=64)
    k = Kernel.open(settings, progress=None)
    try:
        assert k.model.device == cuda and k.model.weight_format == "float32"  # decode: torch (blas is CPU only)
        assert k.model.model_id.endswith("+" + cuda.type) or cuda.type == "cpu"
        secret = b"Booking reference QX7Y2Z for passenger Ada Lovelace, seat 14C."

        def start(tenant: str):  # noqa: ANN202
            s = k.session(tenant)
            s.append("system", "You are a travel assistant.")
            s.append("user", "What is my booking?")
            return s

        seen = start("acme")
        admitted = seen.admit("booking", secret)
        assert admitted.segment is not None
        seen.append("user", "And the weather?")
        seen.evict(admitted.segment.id, "recompute")
        never = start("globex")  # another tenant: no prefix shared with `seen`
        never.append("user", "And the weather?")
        assert seen.fingerprint() == never.fingerprint()

        held = start("acme")
        ref = held.admit("booking", secret).ref
        held.append("user", "Thanks.")
        receipt = k.forget("acme", ref, requested_by="dpo@acme", reason="gdpr_art17", wait_replay=True)
        assert receipt.replay == "verified"
        assert ref not in held.refs()
        after = start("globex")
        after.append("user", "Thanks.")
        assert held.fingerprint() == after.fingerprint()
    finally:
        k.close()

