"""The ``gguf`` weight format (``kernel/model/blockdot.py``, ``kernel/model/csrc/blockdot.c``): block
products against their dequantised float products, rows independent of their call and of
the thread count, the C decode step against torch ops over the same products, and on the
real model: the blocks are exactly the weights the float32 reference computes with."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from support.kernel_helpers import tiny_config

from fak.kernel.model import blockdot
from fak.kernel.model.blockdot import Q4_1, Q8_0, QK, BlockLinear, BlockMatrix
from fak.kernel.model.config import ModelError
from fak.kernel.model.fast_decode import FastDecoder
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.llama import Llama
from fak.kernel.model.weights import random_weights


def dequantise(bm: BlockMatrix) -> torch.Tensor:
    """The float32 matrix of a block matrix, computed as gguf-py's dequantiser does."""
    d = bm.d.view(np.float16).astype(np.float32)[..., None]
    if bm.kind == Q4_1:
        codes = np.concatenate([bm.q & 0x0F, bm.q >> 4], axis=-1).astype(np.float32)
        w = d * codes + bm.m.view(np.float16).astype(np.float32)[..., None]  # type: ignore[union-attr]
    else:
        w = d * bm.q.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(w.reshape(bm.rows, bm.n)))


def random_q4_1(rows: int, n: int, seed: int) -> BlockMatrix:
    rng = np.random.default_rng(seed)
    nb = n // QK
    q = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    d = rng.uniform(0.001, 0.02, size=(rows, nb)).astype(np.float16).view(np.uint16)
    m = rng.uniform(-0.1, 0.0, size=(rows, nb)).astype(np.float16).view(np.uint16)
    return BlockMatrix(Q4_1, q, d, m)


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_a_block_product_is_its_dequantised_product_to_float_rounding(kind: str) -> None:
    """Weights are used as stored and each input block is carried by two int8 codes (x ≈
    d1·q1 + d1·q2/256, d1 = absmax/127): a product differs from the float32 one over the
    dequantised matrix by at most the input's rounding, half of d1/256 per element, times
    the weights' magnitudes (plus float rounding)."""
    torch.manual_seed(0)
    if kind == "q4_1":
        bm = random_q4_1(96, 256, seed=1)
    else:
        bm = BlockMatrix.quantise_q8_0(torch.randn(96, 256) * 0.05)
    x = torch.randn(5, 256)
    x[:, 3] *= 40.0  # an outlier channel, as real activations have
    got = BlockLinear(bm)(x)
    w = dequantise(bm)
    want = x.double() @ w.double().T
    assert got.shape == (5, 96)
    step = x.view(5, -1, QK).abs().amax(-1) / 127 / 256 / 2  # (5, blocks): the input's rounding per element
    bound = step.double() @ w.abs().view(96, -1, QK).sum(-1).double().T  # (5, 96)
    err = (got.double() - want).abs()
    assert bool((err <= bound * 1.01 + 1e-6 * want.abs().max()).all()), float((err / bound).max())
    assert float(err.max()) > 0  # not a float32 product in disguise: the inputs are rounded


def test_one_row_runs_the_blocks_and_several_rows_the_dense_weights() -> None:
    """A decode step (one row) reads the blocks; a prefill call (several rows) runs
    ``F.linear`` on the float32 matrix the blocks dequantise to."""
    bm = random_q4_1(32, 64, seed=3)
    dense = dequantise(bm)
    lin = BlockLinear(bm, dense)
    x = torch.randn(3, 64)
    assert torch.equal(lin(x), torch.nn.functional.linear(x, dense))
    assert torch.equal(lin(x[:1]), BlockLinear(bm)(x[:1]))
    with pytest.raises(ValueError, match="dense weights of shape"):
        BlockLinear(bm, dense[:, :32])


def test_q8_0_quantisation_is_llama_cpp_s_and_round_trips() -> None:
    w = torch.randn(8, 64)
    bm = BlockMatrix.quantise_q8_0(w)
    assert bm.q.dtype == np.int8 and int(np.abs(bm.q).max()) == 127  # each block's absmax maps to ±127
    assert torch.allclose(dequantise(bm), w, atol=float(w.abs().max()) / 127)


def test_rows_do_not_depend_on_their_call_or_the_thread_count() -> None:
    """A row's bytes are the same alone or among others, with one thread or two: a prefill
    and a replay that cut calls differently still agree row by row on the products."""
    lin = BlockLinear(random_q4_1(64, 128, seed=2))
    x = torch.randn(7, 128)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = lin(x)
        torch.set_num_threads(2)
        two = lin(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    for i in range(7):
        assert torch.equal(lin(x[i : i + 1])[0], one[i])


def test_a_width_not_divisible_by_32_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        BlockMatrix.quantise_q8_0(torch.randn(4, 48))
    cfg = tiny_config(hidden_size=48, head_dim=12)
    with pytest.raises(ValueError, match="divisible by 32"):
        Llama(cfg, random_weights(cfg), weight_format="gguf")


def gguf_tiny(seed: int = 0) -> Llama:
    cfg = tiny_config()
    return Llama(cfg, random_weights(cfg, seed=seed), model_id=f"tiny-{seed}", weight_format="gguf")


def test_the_c_decode_step_equals_torch_ops_over_the_same_products() -> None:
    """The whole step in C (norms, RoPE, cache writes, grouped attention, SwiGLU) against
    the torch decode path running the same block products: the same tokens, and cache
    rows and logits within 1e-4 of their scale (the two order their float sums apart, and
    a product's input codes can round the other way)."""
    model = gguf_tiny()
    assert isinstance(model._fast, blockdot.BlockDecoder)
    torch_path = Llama(model.cfg, model.w, model_id="tiny-0", weight_format="gguf")
    torch_path._fast = FastDecoder(model.cfg, model.w, model.lin, model.head)
    prompt = list(range(3, 40))
    runs = []
    for m in (model, torch_path):
        cache = m.new_cache()
        tokens = list(generate(m, cache, prompt, SamplingParams(max_tokens=12, min_tokens=12)))
        runs.append((tokens, cache, m.forward([tokens[-1]], cache)))
    (t_c, c_c, l_c), (t_t, c_t, l_t) = runs
    assert t_c == t_t
    n = c_c.length
    for a, b in ((c_c.k, c_t.k), (c_c.kraw, c_t.kraw), (c_c.v, c_t.v)):
        assert float((a[:, :n] - b[:, :n]).abs().max()) <= 1e-4 * float(b[:, :n].abs().max())
    assert float((l_c - l_t).abs().max()) <= 1e-4 * float(l_t.abs().max())


def test_sessions_decoding_at_once_in_threads_get_their_own_bytes() -> None:
    """Each calling thread has its own step buffers: two decodes at once give what each
    gives alone."""
    model = gguf_tiny()
    prompts = [list(range(5, 30)), list(range(60, 71))]

    def run(prompt: list[int]) -> tuple[list[int], str]:
        cache = model.new_cache()
        tokens = list(generate(model, cache, prompt, SamplingParams(max_tokens=24, min_tokens=24)))
        return tokens, cache.fingerprint()

    alone = [run(p) for p in prompts]
    together: list[tuple[list[int], str] | None] = [None, None]

    def worker(i: int) -> None:
        for _ in range(3):
            together[i] = run(prompts[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_a_missing_compiler_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ModelError, match="cannot run the C compiler"):
        blockdot.compile_library(str(tmp_path / "no-such-cc"), tmp_path / "out.so")
    assert not list(tmp_path.glob("out*"))


def test_a_library_another_user_may_write_is_not_loaded(tmp_path) -> None:
    """A planted or tampered .so in a shared cache folder would run as the server."""
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    lib = folder / "blockdot-x.so"
    lib.write_bytes(b"")
    lib.chmod(0o644)
    blockdot.check_owned(lib)  # ours, written by us only
    lib.chmod(0o664)
    with pytest.raises(ModelError, match="writable by another user"):
        blockdot.check_owned(lib)
    lib.chmod(0o644)
    folder.chmod(0o777)
    with pytest.raises(ModelError, match="writable by another user"):
        blockdot.check_owned(lib)


def test_a_failed_compile_leaves_nothing_and_says_why(tmp_path) -> None:
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'blockdot.c:1: error: no' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ModelError, match="error: no"):
        blockdot.compile_library(str(fake), tmp_path / "out.so")
    assert not list(tmp_path.glob("out*"))


@pytest.mark.real_model
def test_smollm2_s_blocks_are_exactly_the_reference_weights(smollm2) -> None:
    """The float32 reference computes with the GGUF's dequantised Q4_1/Q8_0 blocks; the
    gguf format keeps those blocks (Q/K rows in the reference's order), so its weights are
    the reference's to the bit."""
    from fak.kernel.model.weights import default_model_path

    ref = smollm2.model
    blocks = blockdot.gguf_blocks(default_model_path(), ref.cfg)
    down = blockdot.file_matrix([blocks["model.layers.0.mlp.down_proj.weight"]])
    assert isinstance(down, BlockMatrix) and down.kind == Q4_1
    for i in (0, len(ref.w.layers) - 1):
        lw, p = ref.w.layers[i], f"model.layers.{i}."
        for name, want in (("self_attn.q_proj", lw.wq), ("self_attn.k_proj", lw.wk), ("self_attn.v_proj", lw.wv),
                           ("self_attn.o_proj", lw.wo), ("mlp.gate_proj", lw.w_gate), ("mlp.down_proj", lw.w_down)):
            t = blocks[p + name + ".weight"]
            assert torch.equal(dequantise(blockdot.file_matrix([t])), want), name
            assert torch.equal(blockdot.RawRows([t]).dequantise(), want), name  # the in-place reading, rows reordered
    embed = blocks["model.embed_tokens.weight"]
    assert torch.equal(dequantise(blockdot.file_matrix([embed])), ref.w.lm_head)
    assert torch.equal(blockdot.RawRows([embed]).dequantise(), ref.w.lm_head)
    model = Llama(ref.cfg, ref.w, model_id=ref.model_id, weight_format="gguf", blocks=blocks)
    assert model.head.w.kind == Q8_0  # the tied head runs the file's Q8_0 blocks
    assert model.model_id == ref.model_id + "+gguf-v2"
    # without the file's blocks the products are Q8_0 of the floats: other rows, another model_id
    assert Llama(ref.cfg, ref.w, model_id=ref.model_id, weight_format="gguf").model_id == ref.model_id + "+gguf-q8_0"


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_a_prefill_tile_is_the_bytes_of_each_input_row_alone(kind: str) -> None:
    """A prefill call (weight rows unpacked in tiles of 8, input rows four at a time, then one
    by one) is, row for row, the bytes of the decode step's product of each input row alone
    (fewer than four input rows read the weights straight), with whole groups of 8 blocks
    and a tail (n = 320: ten blocks) and a last tile of weight rows that is not full (13)."""
    rng = np.random.default_rng(5)
    if kind == "q4_1":
        bm = random_q4_1(13, 320, seed=6)
    else:
        q = rng.integers(-128, 128, size=(13, 10, 32), dtype=np.int8)
        d = rng.uniform(0.001, 0.02, size=(13, 10)).astype(np.float16).view(np.uint16)
        bm = BlockMatrix(Q8_0, q, d, None)
    lin = BlockLinear(bm)
    x = torch.randn(11, 320)
    together = lin(x)
    for i in range(11):
        assert torch.equal(lin(x[i : i + 1]), together[i : i + 1]), i
    assert torch.equal(lin(x[:3]), together[:3])  # three rows: the straight reads, together
