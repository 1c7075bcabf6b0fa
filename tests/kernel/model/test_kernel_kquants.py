"""The ``gguf`` format's block types read in place (``RawRows``, ``csrc/blockdot.c``'s RAW kind):
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows of random block bytes, dequantised
exactly as gguf-py's reference (llama.cpp's layouts) dequantises them, their products
within the inputs' rounding of the dequantised float product, a row's bytes independent of
its call, and a tensor type the kernel does not compute refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from fak.kernel.model import blockdot
from fak.kernel.model.blockdot import BlockLinear, FileTensor, RawRows
from fak.kernel.model.config import ModelError

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# where each block type keeps its float16 fields (byte offsets in a block), set to sane scales
HALF_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2],
               "Q5_K": [0, 2], "Q6_K": [208]}


def random_tensor(type_name: str, rows: int, n: int, seed: int, order: np.ndarray | None = None) -> FileTensor:
    """A tensor of random block bytes (any code is valid), its float16 scales drawn small and
    finite, as a file would hold it."""
    qtype = GGMLQuantizationType[type_name]
    values, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, n // values, size), dtype=np.uint8)
    for off in HALF_FIELDS[type_name]:
        halves = rng.uniform(-0.02, 0.02, size=(rows, n // values)).astype(np.float16)
        if off == 0 or type_name == "Q6_K":  # scales positive; mins either sign
            halves = np.abs(halves)
        blocks[..., off : off + 2] = halves.view(np.uint8).reshape(rows, n // values, 2)
    return FileTensor(f"blk.0.{type_name.lower()}.weight", type_name, blocks.reshape(rows, -1), n, order)


def reference(t: FileTensor) -> torch.Tensor:
    """gguf-py's dequantisation (the numpy port of llama.cpp's), rows in the model's order."""
    w = np.asarray(dequantize(t.raw, GGMLQuantizationType[t.type_name]), dtype=np.float32).reshape(t.rows, t.n)
    return torch.from_numpy(np.ascontiguousarray(w if t.order is None else w[t.order]))


@pytest.mark.parametrize("type_name", TYPES)
def test_rows_read_in_place_are_the_reference_dequantisation_to_the_bit(type_name: str) -> None:
    order = np.random.default_rng(7).permutation(24)
    t = random_tensor(type_name, 24, 512, seed=1, order=order)
    assert torch.equal(RawRows([t]).dequantise(), reference(t))


@pytest.mark.parametrize("type_name", TYPES)
def test_a_product_is_its_dequantised_product_within_the_inputs_rounding(type_name: str) -> None:
    """Weights are used as stored; each input block of 32 is carried by two int8 codes (x ≈
    d1·(q1 + q2/256), d1 = absmax/127), so a product differs from the float64 one over the
    dequantised weights by at most half of d1/256 per element times |w| (plus float sums)."""
    t = random_tensor(type_name, 40, 512, seed=2)
    x = torch.randn(6, 512)
    x[:, 5] *= 30.0  # an outlier channel, as real activations have
    w = reference(t).double()
    got = BlockLinear(RawRows([t]))(x).double()
    want = x.double() @ w.T
    d1 = x.reshape(6, -1, 32).abs().amax(-1).double() / 127  # (6, blocks)
    bound = (0.5 * d1 / 256).repeat_interleave(32, dim=1) @ w.abs().T + 1e-5 * (x.double().abs() @ w.abs().T)
    assert ((got - want).abs() <= bound).all(), float(((got - want).abs() / bound).max())


def test_fused_types_and_every_row_the_bytes_of_its_own_call() -> None:
    """One matrix fusing three block types (a Q4_K_M file's q, k in Q4_K and v in Q6_K): each
    output row is the same bytes whether its input is alone, among others, or the call has
    one thread or two; and it is the bytes of each part's own matrix."""
    parts = [random_tensor("Q4_K", 16, 256, seed=3), random_tensor("Q4_K", 8, 256, seed=4),
             random_tensor("Q6_K", 8, 256, seed=5)]
    fused = BlockLinear(RawRows(parts))
    x = torch.randn(7, 256)
    together = fused(x)
    alone = torch.cat([fused(x[i : i + 1]) for i in range(7)])
    assert torch.equal(together, alone)
    torch.set_num_threads(1)
    try:
        assert torch.equal(fused(x), together)
    finally:
        torch.set_num_threads(2)
    own = torch.cat([BlockLinear(RawRows([p]))(x) for p in parts], dim=1)
    assert torch.equal(own, together)


def test_a_tensor_type_the_kernel_does_not_compute_is_refused_by_name() -> None:
    t = FileTensor("blk.3.ffn_down.weight", "Q3_K", np.zeros((4, 110), dtype=np.uint8), 256)
    with pytest.raises(ModelError, match=r"blk\.3\.ffn_down\.weight is Q3_K.*FAK_WEIGHTS=float32"):
        blockdot.file_matrix([t])
    with pytest.raises(ModelError, match="Q3_K"):
        RawRows([t])


def test_a_row_of_the_wrong_size_is_refused() -> None:
    t = random_tensor("Q4_K", 4, 256, seed=6)
    short = FileTensor(t.name, t.type_name, np.ascontiguousarray(t.raw[:, :-2]), 256)
    with pytest.raises(ModelError, match="bytes a row"):
        RawRows([short])


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("n", [512, 288])
def test_each_row_alone_is_the_bytes_of_its_row_in_a_prefill(type_name: str, n: int) -> None:
    """A decode row (one input: the file's bytes read straight, for the common types) is the
    bytes of the same row inside a multi-row call (rows unpacked once, tiles of 4 x 4 and the
    rows past the last tile one by one), also where the row's blocks do not fill a group of
    8 (n = 288: nine blocks)."""
    if type_name.endswith("_K") and n % 256:
        pytest.skip("K-quant rows are whole super-blocks of 256")
    t = random_tensor(type_name, 10, n, seed=8)
    lin = BlockLinear(RawRows([t]))
    x = torch.randn(9, n)
    together = lin(x)
    for i in range(9):
        assert torch.equal(lin(x[i : i + 1]), together[i : i + 1]), i


def test_rows_that_are_not_whole_blocks_and_ids_out_of_range_are_refused() -> None:
    """A crafted file's K-quant rows of 288 values (not whole super-blocks) never reach the C
    reader, and an embedding row past the table is an error, not a read of another address."""
    t = random_tensor("Q4_K", 4, 512, seed=9)
    partial = FileTensor(t.name, "Q4_K", t.raw, 288)
    with pytest.raises(ModelError, match="not whole Q4_K blocks"):
        RawRows([partial])
    embed = blockdot.BlockEmbedding(RawRows([t]))
    assert embed(torch.tensor([0, 3])).shape == (2, 512)
    for bad in ([4], [-1]):
        with pytest.raises(ValueError, match=r"token ids must lie in \[0, 4\)"):
            embed(torch.tensor(bad))


def test_a_truncated_or_malformed_gguf_file_is_a_model_error(tmp_path) -> None:
    from support.gguf_files import write_gguf
    from support.kernel_helpers import tiny_model

    from fak.kernel.model.gguf_file import GGUFFile

    path = tmp_path / "m.gguf"
    write_gguf(path, tiny_model(seed=1), "Q8_0", "llama")
    assert {t.tensor_type.name for t in GGUFFile(path).tensors} == {"F32", "Q8_0"}
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    with pytest.raises(ModelError, match="runs past the end of the file"):
        GGUFFile(cut)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 60)
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        GGUFFile(junk)


def test_a_tile_mixing_block_types_gives_each_row_its_own_bytes() -> None:
    """Prefill tiles hold 8 weight rows: here the first tile mixes Q4_K rows (one scale per 32
    values, mins) with Q6_K rows (two scales per 32, no mins) and the second Q6_K with Q8_0;
    each row is still the bytes of the decode step's product of each input row alone."""
    parts = [random_tensor("Q4_K", 4, 512, seed=11), random_tensor("Q6_K", 7, 512, seed=12),
             random_tensor("Q8_0", 6, 512, seed=13)]
    fused = BlockLinear(RawRows(parts))
    x = torch.randn(6, 512)
    together = fused(x)
    for i in range(6):
        assert torch.equal(fused(x[i : i + 1]), together[i : i + 1]), i
    assert torch.equal(torch.cat([BlockLinear(RawRows([p]))(x) for p in parts], dim=1), together)
