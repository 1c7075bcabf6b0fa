"""A GGUF file in K-quants, as people download them (Q4_K_M's mix: Q4_K for most matrices, Q6_K
for attn_v, ffn_down and the output), loaded by ``load_model`` in the ``gguf`` format: the
products and the embedding read the file's blocks in place (no float copy of any matrix), the
logits oracle-close to the float32 reference over the same file's dequantised blocks, the
format bit-exact to itself (the same prefill twice; a batched step is a lone step's bytes),
``fak info`` names each tensor type and what computes it, and a file with a type the kernel
does not compute is refused by name. The same files against llama.cpp: test_kquant_llamacpp.py."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
from support.gguf_files import write_gguf
from support.kernel_helpers import tiny_model

from fak.cli import main as fak_main
from fak.kernel.model.config import ModelError
from fak.kernel.model.loader import load_model

# a Q4_K_M file's types by tensor (llama.cpp's choice for most layers)
Q4_K_M = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
          "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"}
SHAPE = dict(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, head_dim=64, num_layers=2,
             tie_word_embeddings=False)


def write(path: Path, types: dict[str, str]) -> Path:
    write_gguf(path, tiny_model(seed=5, **SHAPE), "F32", "llama", block_types=types)
    return path


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("kquant")
    return write(folder / "tiny-q4_k_m.gguf", Q4_K_M), folder / "cache"


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 257, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_file_s_blocks_are_read_in_place_and_oracle_close_to_float32(q4_k_m) -> None:
    path, cache = q4_k_m
    gguf = load_model(path, weight_format="gguf", cache_dir=cache).model
    ref = load_model(path, weight_format="float32", cache_dir=cache).model
    assert gguf.model_id.endswith("+gguf-v2") and gguf.model_id.startswith(ref.model_id)
    layer = gguf.w.layers[0]
    assert all(t.is_meta for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, gguf.w.embed, gguf.w.lm_head))
    assert sorted(gguf.lin[0].qkv.w.types) == ["Q4_K", "Q6_K"]  # q, k in Q4_K and v in Q6_K, one product
    assert torch.equal(gguf.embed(torch.tensor([3, 200])), ref.w.embed[[3, 200]])  # rows dequantised as ggml does
    ids = tokens(96, seed=1)
    got = gguf.forward(ids, gguf.new_cache(128), all_logits=True)
    want = ref.forward(ids, ref.new_cache(128), all_logits=True)
    spread = float(want.std())
    err = (got - want).abs()
    # inputs rounded to ~15 bits: measured max 4e-4 x spread; a wrong layout or scale moves logits by ~spread
    assert float(err.max()) <= 5e-3 * spread, float(err.max()) / spread
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * float(err.max())
    assert int(clear.sum()) >= 48
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_the_format_is_bit_exact_to_itself(q4_k_m) -> None:
    """The same prefill twice gives the same bytes (RECOMPUTE's claim); a batched decode step
    is each row's lone step to the byte; a decode step oracle-close to the same row prefilled."""
    path, cache = q4_k_m
    m = load_model(path, weight_format="gguf", cache_dir=cache).model
    ids = tokens(40, seed=2)
    a, b = m.new_cache(64), m.new_cache(64)
    la, lb = m.forward(ids, a, all_logits=True), m.forward(ids, b, all_logits=True)
    assert torch.equal(la, lb) and torch.equal(a.k[:, :40], b.k[:, :40]) and torch.equal(a.v[:, :40], b.v[:, :40])
    step = m.new_cache(64)
    m.forward(ids[:-1], step)
    last = m.forward(ids[-1:], step)
    assert float((last - la[-1:]).abs().max()) <= 1e-3 * float(la.std())
    caches, twins = [m.new_cache(64) for _ in range(5)], [m.new_cache(64) for _ in range(5)]
    for i, (c, t) in enumerate(zip(caches, twins, strict=True)):
        m.forward(ids[: 5 + 3 * i], c)
        m.forward(ids[: 5 + 3 * i], t)
    batched = m.forward_batch([(7 + i, c) for i, c in enumerate(caches)])
    for i, (t, logits) in enumerate(zip(twins, batched, strict=True)):
        assert torch.equal(m.forward([7 + i], t), logits)


def test_fak_info_names_each_tensor_type_and_its_path(q4_k_m, monkeypatch) -> None:
    path, cache = q4_k_m
    monkeypatch.setenv("FAK_CACHE_DIR", str(cache))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert fak_main(["info", "--model", str(path), "--weights", "gguf"]) == 0
    text = out.getvalue()
    assert "Q4_K tensors (11)" in text and "Q6_K tensors (5)" in text  # 2 layers: 5 + 2 Q4_K, 2 + 2 Q6_K, + embd/output
    assert "read in place" in text and "C block step" in text
    assert "gguf kernel units" in text and ("AVX" in text or "plain C loops" in text)


def test_a_file_with_a_type_the_kernel_does_not_compute_is_refused_by_name(tmp_path) -> None:
    path = write(tmp_path / "q3.gguf", Q4_K_M | {"ffn_down": "Q3_K"})
    with pytest.raises(ModelError, match=r"blk\.0\.ffn_down\.weight is Q3_K.*never re-quantises.*FAK_WEIGHTS=float32"):
        load_model(path, weight_format="gguf", cache_dir=tmp_path / "cache")
    assert load_model(path, weight_format="float32", cache_dir=tmp_path / "cache").model.cfg.num_layers == 2
