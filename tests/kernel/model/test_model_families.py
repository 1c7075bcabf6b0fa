"""The decoder families fak runs besides Llama 2-style models: Qwen2 (q/k/v biases), Qwen3
(per-head q/k RMSNorm, a head_dim of its own), Mistral (a sliding window: a query attends to
the keys less than ``sliding_window`` positions back) and Llama 3 (its RoPE scaling), against
transformers' own classes for each (``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM``,
``LlamaForCausalLM``), eager float32, on tiny random configs.

Words as in docs/design.md: oracle-exact = max|Δlogits| = 0 against transformers eager
float32; oracle-close = max|Δlogits| ≤ 1e-4 and the same argmax everywhere.

Each family is witnessed from three sources of the same weights: the random weights
themselves, an HF safetensors folder (float32, float16, bfloat16) and a GGUF file written
with llama.cpp's names, layouts and metadata keys (F32, F16, Q8_0), through ``load_model``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support.gguf_files import write_gguf
from support.kernel_helpers import (
    LLAMA3,
    assert_never_saw,
    hf_logits,
    hf_oracle,
    poisoned_in_the_middle,
    tiny_model,
)
from tokenizers import Tokenizer, models, pre_tokenizers

from fak.kernel.kv.session import EvictMode
from fak.kernel.model import blockdot
from fak.kernel.model.config import ModelConfig, ModelError
from fak.kernel.model.fast_decode import FastDecoder
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.llama import Llama
from fak.kernel.model.loader import load_model
from fak.kernel.model.weights import state_dict_from_weights

# tiny random configs: GQA everywhere, tied and untied heads, Qwen3 with head_dim*heads != hidden
FAMILIES: dict[str, dict] = {
    "qwen2": dict(arch="qwen2", num_kv_heads=2, tie_word_embeddings=True, rope_theta=1000000.0),
    "qwen3": dict(arch="qwen3", num_kv_heads=2, head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0),
    # a window of 12 binds on every sequence below (prompts of 16 to 96 tokens)
    "mistral": dict(arch="mistral", num_kv_heads=1, tie_word_embeddings=False, sliding_window=12),
    "llama3": dict(arch="llama", num_kv_heads=2, rope_scaling=LLAMA3, rope_theta=500000.0),
}
GGUF_ARCH = {"qwen2": "qwen2", "qwen3": "qwen3", "mistral": "llama", "llama3": "llama"}  # general.architecture


def _ids(n: int, seed: int = 1) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def assert_oracle_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() <= 1e-4
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def family_model(family: str, attention: str = "eager", decode: str = "auto") -> Llama:
    return tiny_model(seed=3, attention=attention, decode=decode, **FAMILIES[family])


# --- writing checkpoints the way their tools write them ------------------------------------


def _tokenizer_json(folder: Path) -> None:
    """A minimal byte-level tokenizer: ``load_model`` loads one with every model."""
    tk = Tokenizer(models.BPE(vocab={chr(i + 33): i for i in range(200)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.save(str(folder / "tokenizer.json"))


def write_hf_folder(folder: Path, model: Llama, dtype: torch.dtype) -> None:
    """``config.json`` of the family (as ``to_hf`` gives it) and one safetensors file in ``dtype``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.cfg.to_hf()))
    sd = {k: v.to(dtype).contiguous().clone() for k, v in state_dict_from_weights(model.cfg, model.w).items()}
    save_file(sd, str(folder / "model.safetensors"))
    _tokenizer_json(folder)


# --- the oracle, per family --------------------------------------------------------------------


def _check_full_sequence_and_generate(model: Llama, hf) -> None:  # noqa: ANN001
    """Eager full sequence oracle-exact, greedy tokens equal to HF generate()."""
    ids = _ids(96)
    ours = model.forward(ids, model.new_cache(), all_logits=True)
    ref = hf_logits(hf, ids)
    assert (ours - ref).abs().max().item() == 0.0
    prompt = _ids(16, seed=2)
    got = list(generate(model, model.new_cache(), prompt, SamplingParams(max_tokens=16, min_tokens=16)))
    with torch.inference_mode():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False)
    assert got == out[0, len(prompt) :].tolist()


def _check_chunked_and_decode(model: Llama, ref: torch.Tensor, ids: list[int]) -> None:
    cache = model.new_cache(capacity=8)  # grows on the way
    parts = [model.forward(ids[:29], cache, all_logits=True), model.forward(ids[29:50], cache, all_logits=True)]
    parts += [model.forward([t], cache) for t in ids[50:]]
    assert_oracle_close(torch.cat(parts), ref)
    assert cache.growths > 0


def _check_recompute_evict(model: Llama) -> None:
    """A RECOMPUTE eviction of a span in the middle leaves the bytes of a session that never read it."""
    seen, poison, clean = poisoned_in_the_middle(model, chunk_size=7)
    report = seen.evict([poison.id], EvictMode.RECOMPUTE)
    assert report.exactness == "bit-exact"
    assert_never_saw(seen, clean, chunk_size=7)


def _family_test(family: str) -> None:
    model = family_model(family)
    hf = hf_oracle(model)
    _check_full_sequence_and_generate(model, hf)
    ids = _ids(70, seed=5)
    ref = hf_logits(hf, ids)
    for attention, decode in (("eager", "blas"), ("sdpa", "blas"), ("sdpa", "torch")):
        m = family_model(family, attention=attention, decode=decode)
        assert m.decode == decode
        _check_chunked_and_decode(m, ref, ids)
    for decode in ("blas", "torch"):
        _check_recompute_evict(family_model(family, attention="sdpa", decode=decode))


def test_oracle_qwen2_full_sequence() -> None:
    """Qwen2 (q/k/v biases, none on the output; GQA, tied head): eager full sequence oracle-exact
    (Δ = 0: the biases are added inside ``F.linear`` as ``nn.Linear`` does); greedy tokens equal
    to ``Qwen2ForCausalLM.generate``; chunked prefill + decode oracle-close in each backend;
    RECOMPUTE eviction bit-exact to a session that never saw the span."""
    _family_test("qwen2")


def test_oracle_qwen3_full_sequence() -> None:
    """Qwen3 (RMSNorm over each q and k head before RoPE; head_dim 32 with 4 heads over a
    hidden size of 64; GQA, untied head): the same four witnesses as Qwen2, oracle-exact on the
    eager full sequence."""
    _family_test("qwen3")


def test_oracle_mistral_full_sequence() -> None:
    """Mistral with a sliding window of 12 positions that binds on every sequence here (MQA,
    untied head): oracle-exact on the eager full sequence (the window is the same additive mask
    as transformers'), greedy tokens equal to ``generate()``'s well past the window, chunked +
    decode oracle-close in each backend (decode steps drop the rows out of the window), RECOMPUTE
    eviction bit-exact; and without the window the logits are another computation."""
    _family_test("mistral")
    model = family_model("mistral")
    unwindowed = tiny_model(seed=3, attention="eager", **(FAMILIES["mistral"] | {"sliding_window": None}))
    ids = _ids(40)
    a = model.forward(ids, model.new_cache(), all_logits=True)
    b = unwindowed.forward(ids, unwindowed.new_cache(), all_logits=True)
    assert torch.equal(a[:12], b[:12]) and (a[12:] - b[12:]).abs().max() > 1e-2


def test_oracle_llama3_full_sequence() -> None:
    """Llama 3 (llama3 RoPE scaling, theta 5e5; GQA, tied head): still oracle-exact."""
    _family_test("llama3")


# --- the same from checkpoint files ----------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_hf_folder_loads_each_family(tmp_path, family: str, dtype: torch.dtype) -> None:
    """An HF folder (config.json of the family + safetensors in float32/float16/bfloat16) loads
    the family's config and tensors (biases, q/k norms); computed in float32, the loaded model
    is oracle-exact against HF holding the same (dtype-rounded) weights."""
    model = family_model(family)
    write_hf_folder(tmp_path, model, dtype)
    loaded = load_model(tmp_path, cache_dir=tmp_path / "cache").model
    assert loaded.cfg.arch == model.cfg.arch and loaded.cfg.head_dim == model.cfg.head_dim
    for a, b in zip(loaded.w.layers, model.w.layers, strict=True):
        for name in ("wqkv", "qkv_bias", "q_norm", "k_norm"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if y is not None:
                assert torch.equal(x, y.to(dtype).float()), name
    eager = Llama(loaded.cfg, loaded.w, attention="eager")
    ids = _ids(48)
    assert (eager.forward(ids, eager.new_cache(), all_logits=True) - hf_logits(hf_oracle(eager), ids)).abs().max() == 0


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0"])
def test_gguf_file_loads_each_family(tmp_path, family: str, kind: str) -> None:
    """A GGUF file written with llama.cpp's names and metadata keys for the family
    (``general.architecture`` qwen2 / qwen3 / llama for Mistral and Llama 3, Mistral's window as
    ``llama.attention.sliding_window``, Q/K rows permuted for llama only) loads the same tensors (F32: the same bytes; F16/Q8_0: their dequantisation);
    the loaded float32 model is oracle-exact on the eager full sequence and oracle-close chunked
    + decoded against HF holding the dequantised weights; RECOMPUTE eviction bit-exact."""
    model = family_model(family)
    path = tmp_path / f"{family}.{kind}.gguf"
    write_gguf(path, model, kind, GGUF_ARCH[family])
    loaded = load_model(path, cache_dir=tmp_path / "cache").model
    cfg = loaded.cfg
    assert cfg.arch == model.cfg.arch and cfg.head_dim == model.cfg.head_dim  # mistral: llama + a window
    assert cfg.sliding_window == model.cfg.sliding_window
    assert cfg.attention_bias == model.cfg.attention_bias and cfg.qk_norm == model.cfg.qk_norm
    assert cfg.tie_word_embeddings == model.cfg.tie_word_embeddings
    a, b = loaded.w.layers[1], model.w.layers[1]
    if kind == "F32":
        assert torch.equal(a.wqkv, b.wqkv)  # names, shapes and the Q/K row order all as written
    else:
        assert (a.wqkv - b.wqkv).abs().max() <= (0.02 if kind == "Q8_0" else 1e-3) * b.wqkv.abs().max()
    for name in ("qkv_bias", "q_norm", "k_norm"):  # 1-D tensors stay F32: the same bytes
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None) and (y is None or torch.equal(x, y)), name
    hf = hf_oracle(loaded)
    ids = _ids(64, seed=7)
    ref = hf_logits(hf, ids)
    eager = Llama(cfg, loaded.w, attention="eager")
    assert (eager.forward(ids, eager.new_cache(), all_logits=True) - ref).abs().max() == 0
    _check_chunked_and_decode(loaded, ref, ids)
    _check_recompute_evict(loaded)


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral"])
def test_gguf_blocks_c_decode_equals_torch_ops_per_family(tmp_path, family: str) -> None:
    """The ``gguf`` weight format's C decode step (the file's Q8_0 blocks) applies the family's
    biases, q/k norms and sliding window (a 30-token prompt and 10 steps against a window of
    12): its tokens equal the torch decode path running the same block products,
    cache rows and logits within 1e-4 of their scale; a batched step is the bytes of a lone one."""
    model = family_model(family)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, model, "Q8_0", GGUF_ARCH[family])
    c_model = load_model(path, weight_format="gguf", cache_dir=tmp_path / "cache").model
    assert isinstance(c_model._fast, blockdot.BlockDecoder)
    torch_path = Llama(c_model.cfg, c_model.w, model_id="t", weight_format="gguf",
                       blocks=blockdot.gguf_blocks(path, c_model.cfg))  # the file's blocks: no floats to fall back on
    torch_path._fast = FastDecoder(c_model.cfg, c_model.w, c_model.lin, c_model.head, c_model.embed)
    prompt = _ids(30, seed=9)
    runs = []
    for m in (c_model, torch_path):
        cache = m.new_cache()
        tokens = list(generate(m, cache, prompt, SamplingParams(max_tokens=10, min_tokens=10)))
        runs.append((tokens, cache, m.forward([tokens[-1]], cache)))
    (t_c, c_c, l_c), (t_t, c_t, l_t) = runs
    assert t_c == t_t
    n = c_c.length
    for x, y in ((c_c.k, c_t.k), (c_c.kraw, c_t.kraw), (c_c.v, c_t.v)):
        assert float((x[:, :n] - y[:, :n]).abs().max()) <= 1e-4 * float(y[:, :n].abs().max())
    assert float((l_c - l_t).abs().max()) <= 1e-4 * float(l_t.abs().max())
    # batched decode: each session's row is the bytes of its own lone step
    caches, twins = [c_model.new_cache(), c_model.new_cache()], [c_model.new_cache(), c_model.new_cache()]
    for p, cache, twin in zip((prompt[:12], prompt[12:]), caches, twins, strict=True):
        c_model.forward(p, cache)
        c_model.forward(p, twin)
    batched = c_model.forward_batch([(5, caches[0]), (6, caches[1])])
    for tok, twin, logits in zip((5, 6), twins, batched, strict=True):
        assert torch.equal(c_model.forward([tok], twin), logits)


# --- refusals ------------------------------------------------------------------------------------------


def _hf_cfg(arch: str, **fields) -> dict:
    base = ModelConfig(**(dict(vocab_size=257, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4,
                                max_position_embeddings=512, tie_word_embeddings=True, arch=arch)))
    return base.to_hf() | fields


REFUSALS = {
    "mistral_sliding_window_zero": ("mistral", dict(sliding_window=0), "sliding_window=0"),
    "qwen2_use_sliding_window": ("qwen2", dict(use_sliding_window=True), "use_sliding_window=True"),
    "qwen3_layer_types": ("qwen3", dict(layer_types=["full_attention", "sliding_attention"]), "layer_types="),
    "llama_mlp_bias": ("llama", dict(mlp_bias=True), "mlp_bias=True"),
    "llama_attention_bias": ("llama", dict(attention_bias=True), "attention_bias=True"),
    "qwen3_attention_bias": ("qwen3", dict(attention_bias=True), "attention_bias=True"),
    "qwen2_yarn_rope": ("qwen2", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling='yarn'"),
    "mistral_hidden_act": ("mistral", dict(hidden_act="gelu"), "hidden_act='gelu'"),
    "qwen3_moe": ("qwen3_moe", {}, "model_type"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_config_fak_cannot_run_exactly_is_refused_naming_the_field(case: str) -> None:
    arch, fields, named = REFUSALS[case]
    cfg = _hf_cfg("qwen3" if arch == "qwen3_moe" else arch, **fields)
    if arch == "qwen3_moe":
        cfg |= {"model_type": "qwen3_moe", "num_experts": 8}
    with pytest.raises(ModelError, match=named.replace("[", r"\[")):
        ModelConfig.from_hf(cfg)


def test_accepted_configs_round_trip_through_to_hf() -> None:
    """from_hf(to_hf(cfg)) is cfg for every family (Mistral's window included); a window on
    another family is refused."""
    for family in FAMILIES:
        cfg = family_model(family).cfg
        assert ModelConfig.from_hf(cfg.to_hf() | {"_name_or_path": cfg.name}) == cfg, family
    assert ModelConfig.from_hf(_hf_cfg("mistral", sliding_window=512)).sliding_window == 512
    with pytest.raises(ModelError, match="sliding_window=8"):
        ModelConfig(**(family_model("qwen2").cfg.to_dict() | {"sliding_window": 8, "rope_scaling": {}}))
    assert ModelConfig.from_dict(family_model("qwen3").cfg.to_dict()).qk_norm


@pytest.mark.parametrize(
    ("case", "named"),
    [("sliding_window", "qwen2.attention.sliding_window=64"), ("bias", "blk.0.attn_q.bias"),
     ("q_norm", "blk.0.attn_q_norm.weight")],
)
def test_a_gguf_file_fak_cannot_run_exactly_is_refused_naming_the_field(tmp_path, case: str, named: str) -> None:
    """A Qwen2 GGUF with a sliding window (Qwen's windows are per layer: not computed), or a
    llama GGUF with tensors of another family (q biases, q/k norms), is refused by name."""
    donor = {"sliding_window": "qwen2", "bias": "qwen2", "q_norm": "qwen3"}[case]
    model = family_model(donor)
    path = tmp_path / "x.gguf"
    meta = {"qwen2.attention.sliding_window": 64} if case == "sliding_window" else None
    write_gguf(path, model, "F32", "qwen2" if case == "sliding_window" else "llama", metadata=meta)
    with pytest.raises(ModelError, match=named):
        load_model(path, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("family", FAMILIES)
def test_pic_layer1_deviation_knows_each_family(family: str) -> None:
    """PIC's selective recompute scores rows by how far their cached layer-1 keys and values are
    from a fresh computation; rows computed in this very context score 0 up to float rounding
    in every family (the fresh keys get Qwen2's biases and Qwen3's k norm, as the cached
    ``Kraw`` did; without them a row scores about the squared norm of its key bias)."""
    from fak.kernel.kv.pic_serve import layer1_deviation

    model = family_model(family, attention="sdpa")
    cache = model.new_cache()
    model.forward(_ids(48), cache)
    scale = float(cache.kraw[1, 10:40].pow(2).sum(dim=(1, 2)).min())
    assert float(layer1_deviation(model, cache, 10, 40).max()) <= 1e-6 * scale
