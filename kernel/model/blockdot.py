"""The ``gguf`` weight format: products over the model file's own quantised blocks.

A GGUF file stores each weight matrix in blocks (Q4_0 … Q8_0: 32 weights with a float16 scale
and maybe a minimum; Q4_K, Q5_K, Q6_K: 256 weights in sub-blocks with small integer scales under
float16 ones); the float32 reference computes with their dequantisation. This format computes
with the blocks as the memory-mapped file holds them (``FileTensor``, ``RawRows``: one address
and one type per row, so tensors of several types fuse into one product and permuted rows are
read in place) and runs every product in C (``csrc/blockdot.c``): each input row is quantised
in blocks of 32 to two int8 codes (~15 bits, where llama.cpp keeps 8), each block's integer
dot product is exact, and a row's float sequence is the same whether the row is decoded alone,
batched or prefilled, so its bytes never depend on its call. Token embeddings are dequantised
row by row from their blocks (``BlockEmbedding``): no float copy of any matrix. A tensor type
the kernel does not compute is refused by name (``file_matrix``), never re-quantised. Models
that are not GGUF files (HF folders, the tests' random models) are quantised to Q8_0 for decode
and prefill on their floats. SmolLM2's all-Q4_1 and all-Q8_0 matrices keep a split layout
(codes apart from scales, ``BlockMatrix``), the one its decode figures were measured on.

The C file is compiled on first use with the system's C compiler (``cc -O3 -march=native
-ffp-contract=off -fopenmp``) into the cache directory, keyed by its source, the flags and the
CPU, and loaded with ctypes; a machine without a compiler gets a clear error, and the other
formats still work. One decode step is one C call (every layer, threads split rows and heads),
so Python's per-op overhead is gone from decoding.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from fak.kernel.model.config import ModelConfig, ModelError
from fak.kernel.model.gguf_names import hf_name, rotary_heads, unpermute
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.params import Weights
from fak.kernel.model.quant import LayerLinears, cpu_flags, fbgemm_supported
from fak.settings import StorageSettings

if TYPE_CHECKING:
    from fak.kernel.model.gguf_file import GGUFFile

QK = 32
Q4_1, Q8_0, RAW = 0, 1, 2
# the GGUF block types the C kernel computes from the file's own blocks, by GGML type id
COMPUTED_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
SOURCE = Path(__file__).with_name("csrc") / "blockdot.c"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-fPIC", "-shared", "-std=c11")
MAX_HEAD_DIM = 256

# --- building and loading the C library ------------------------------------------------

_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def _compiler() -> str:
    # CC is the C toolchain's own variable (as make and setuptools read it), not a fak setting:
    # an allowed exception to "only fak.settings reads the environment" (tests/repo/test_settings_only_env_reader.py)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ModelError("weights='gguf' compiles a small C kernel on first use and found no C compiler (cc, gcc or clang)")
    return cc


def compile_library(cc: str, target: Path) -> None:
    """Compile ``csrc/blockdot.c`` into ``target`` (written under a temporary name first, so
    a crash or a concurrent build never leaves a partial library behind)."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target.with_suffix(f".tmp{os.getpid()}.so")
    try:
        done = subprocess.run([cc, *FLAGS, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True)
    except OSError as exc:
        raise ModelError(f"weights='gguf': cannot run the C compiler {cc!r} ({exc})") from exc
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise ModelError(f"weights='gguf': compiling {SOURCE.name} with {cc} failed:\n{done.stderr.strip()[-2000:]}")
    os.replace(tmp, target)  # another process may have built it too: the same bytes


def check_owned(path: Path) -> None:
    """Loading a library runs its code: refuse one (or a folder holding it) that another
    user owns or may write, as a planted file in a shared cache folder would be."""
    for p in (path.parent, path):
        st = p.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ModelError(f"weights='gguf': {p} is owned or writable by another user; not loading it "
                             "(remove it, or make it yours and not group/world-writable)")


def library(cache_dir: Path | None = None) -> ctypes.CDLL:
    """The compiled kernel, built once per source, compiler, flags and CPU (then a file open),
    under ``cache_dir`` (``Settings.cache_dir``, which ``load_model`` passes on first use; when
    not given, ``StorageSettings()``'s). Loaded once per process: later calls return it."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        cc = _compiler()
        # -march=native: a library built on another CPU (a shared cache folder) may not run here
        cpu = " ".join(sorted(cpu_flags())) + platform.machine()
        key = hashlib.sha256(SOURCE.read_bytes() + " ".join((cc, *FLAGS, cpu)).encode()).hexdigest()[:16]
        root = cache_dir if cache_dir is not None else StorageSettings().cache_dir
        target = root / "kernels" / f"blockdot-{key}.so"
        if not target.is_file():
            compile_library(cc, target)
        check_owned(target)
        lib = ctypes.CDLL(str(target))
        ptr, i64 = ctypes.c_void_p, ctypes.c_int64
        # fak_matmul(w, x, m, y, ldy, xd, xs, xq, x16, nthreads)
        lib.fak_matmul.argtypes = (ptr, ptr, i64, ptr, i64, ptr, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_matmul.restype = None
        # fak_decode_step(model, token, row, cos, sin_signed, cache, scratch, logits, nthreads)
        lib.fak_decode_step.argtypes = (ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_decode_step.restype = None
        # fak_decode_batch(model, b, tokens, rows, cos, sin_signed, caches, scratch, logits, nthreads)
        lib.fak_decode_batch.argtypes = (ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_decode_batch.restype = None
        # fak_dequant_rows(qmat, ids, count, out)
        lib.fak_dequant_rows.argtypes = (ptr, ptr, i64, ptr)
        lib.fak_dequant_rows.restype = None
        lib.fak_block_bytes.argtypes = (ctypes.c_int,)
        lib.fak_block_bytes.restype = i64
        _lib = lib
        return lib


def fast_path_possible() -> bool:
    """A C compiler is here and the CPU has the vector units the fast path uses (AVX2,
    FMA, F16C); elsewhere the kernel still runs, in plain C, slower than fbgemm."""
    try:
        _compiler()
    except ModelError:
        return False
    return {"avx2", "fma", "f16c"} <= cpu_flags()


def kernel_units() -> str:
    """The vector units the C kernel's integer dots use on this CPU (it is built with
    ``-march=native``): what ``fak info`` names. A decode step's products read the file's
    blocks with int8 dots; a prefill's, and a batch of four or more decode rows, run tiles of
    8 weight rows across the lanes with int16 pair dots (vpmaddwd), whose sums are the same
    integers. AMX is not used."""
    flags = cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return "plain C loops (no AVX2)"
    tiles = "prefill and batches: 8-row int16 tiles (vpmaddwd)"
    if {"avx512_vnni", "avx512vl"} <= flags:
        return f"AVX2 with AVX-512 VNNI dot products (vpdpbusd); {tiles}"
    if "avx_vnni" in flags:
        return f"AVX2 with AVX-VNNI dot products (vpdpbusd, VEX); {tiles}"
    return f"AVX2 (vpmaddubsw + vpmaddwd); {tiles}"


def default_weights() -> Literal["gguf", "float16", "float32"]:
    """The serving default weight format, for ``Settings.weights`` unset (``Kernel.open``, ``fak
    serve``): gguf where its C kernel has its fast path (a C compiler and an AVX2 CPU), else
    float16 where torch has fbgemm (x86-64 CPU builds), else float32. Decided here, when a model
    is about to load, not in ``fak.settings``: deciding asks torch, and commands that read
    settings but load no model (``fak cas rotate``, ``fak keys``, ``fak audit``) must not import it."""
    if fast_path_possible():
        return "gguf"
    return "float16" if fbgemm_supported() else "float32"


# --- ctypes mirrors of the C structs ---------------------------------------------------


class _QMat(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int64),
        ("rows", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("q", ctypes.c_void_p),
        ("d", ctypes.c_void_p),
        ("m", ctypes.c_void_p),
        ("row", ctypes.c_void_p),  # RAW: each row's first block (uint64 addresses)
        ("row_kind", ctypes.c_void_p),  # RAW: each row's GGML type (uint8)
    ]


class _Layer(ctypes.Structure):
    _fields_ = (
        ("attn_norm", ctypes.c_void_p),
        ("mlp_norm", ctypes.c_void_p),
        ("qkv", _QMat),
        ("o", _QMat),
        ("gate_up", _QMat),
        ("down", _QMat),
        ("qkv_bias", ctypes.c_void_p),  # NULL (None) where the family has none
        ("q_norm", ctypes.c_void_p),
        ("k_norm", ctypes.c_void_p),
    )


class _Model(ctypes.Structure):
    _fields_ = (
        ("layers", ctypes.c_int64),
        ("dim", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("ffn", ctypes.c_int64),
        ("vocab", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("embed", ctypes.c_void_p),
        ("norm", ctypes.c_void_p),
        ("head", _QMat),
        ("layer", ctypes.c_void_p),
        ("embed_q", _QMat),  # read when embed is NULL: each token's row dequantised from its blocks
    )


class _Cache(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("kraw", ctypes.c_void_p), ("v", ctypes.c_void_p), ("capacity", ctypes.c_int64),
                ("keep", ctypes.c_void_p)]  # uint8 per row attended (a sliding window), NULL (None) for all


def _keep_bytes(keep: torch.Tensor | None) -> torch.Tensor | None:
    """A step's ``keep`` rows as the uint8 array the C step reads (None: every row)."""
    return None if keep is None else keep.to(torch.uint8).contiguous()


class _Scratch(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p) for name in ("x", "h", "qkv", "att", "gu", "xd", "xs", "scores", "xq")]


class _BatchScratch(ctypes.Structure):
    _fields_ = [*((name, ctypes.c_void_p) for name in ("x", "h", "qkv", "att", "gu", "xd", "xs", "scores", "xq")),
                ("scores_stride", ctypes.c_int64), ("x16", ctypes.c_void_p)]


# --- block matrices -----------------------------------------------------------------------


@dataclass
class BlockMatrix:
    """A ``(rows, n)`` weight matrix in blocks of 32 along ``n``: ``q`` codes (Q4_1: 16
    bytes a block, two 4-bit codes each; Q8_0: 32 int8), ``d`` scales and (Q4_1) ``m``
    minimums as float16 bit patterns, ``(rows, n/32)``."""

    kind: int
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None

    @property
    def rows(self) -> int:
        return int(self.d.shape[0])

    @property
    def n(self) -> int:
        return int(self.d.shape[1]) * QK

    @classmethod
    def from_gguf(cls, kind_name: str, raw: np.ndarray, rows: int, n: int) -> BlockMatrix:
        """A GGUF tensor's raw bytes (``rows * n/32`` blocks) split into codes and scales."""
        nb = n // QK
        if kind_name == "Q4_1":  # struct { half d; half m; uint8 qs[16]; }
            blocks = np.asarray(raw, dtype=np.uint8).reshape(rows, nb, 20)
            return cls(
                Q4_1,
                np.ascontiguousarray(blocks[..., 4:]),
                np.ascontiguousarray(blocks[..., 0:2]).view(np.uint16)[..., 0],
                np.ascontiguousarray(blocks[..., 2:4]).view(np.uint16)[..., 0],
            )
        if kind_name == "Q8_0":  # struct { half d; int8 qs[32]; }
            blocks = np.asarray(raw, dtype=np.uint8).reshape(rows, nb, 34)
            return cls(
                Q8_0,
                np.ascontiguousarray(blocks[..., 2:]).view(np.int8),
                np.ascontiguousarray(blocks[..., 0:2]).view(np.uint16)[..., 0],
                None,
            )
        raise ValueError(f"no kernel for {kind_name} blocks")

    @classmethod
    def quantise_q8_0(cls, w: torch.Tensor) -> BlockMatrix:
        """float weights → Q8_0 as llama.cpp makes it (scale = absmax/127 per block, as float16)."""
        a = w.detach().to(torch.float32).cpu().numpy()
        rows, n = a.shape
        if n % QK:
            raise ValueError(f"weights='gguf' quantises in blocks of {QK}: a width of {n} is not divisible by {QK}")
        blocks = a.reshape(rows, n // QK, QK)
        d = (np.abs(blocks).max(axis=-1) / 127.0).astype(np.float16)
        inv = np.divide(1.0, d.astype(np.float32), out=np.zeros(d.shape, np.float32), where=d != 0)
        q = np.clip(np.rint(blocks * inv[..., None]), -127, 127).astype(np.int8)
        return cls(Q8_0, np.ascontiguousarray(q), d.view(np.uint16), None)

    def permute_rows(self, order: np.ndarray) -> BlockMatrix:
        m = None if self.m is None else np.ascontiguousarray(self.m[order])
        return BlockMatrix(self.kind, np.ascontiguousarray(self.q[order]), np.ascontiguousarray(self.d[order]), m)

    @staticmethod
    def cat(parts: list[BlockMatrix]) -> BlockMatrix:
        """Rows of ``parts`` stacked (all of one kind and width)."""
        kinds = {p.kind for p in parts}
        if len(kinds) != 1:
            raise ValueError("cannot stack block matrices of different kinds")
        m = None if parts[0].m is None else np.concatenate([p.m for p in parts])
        return BlockMatrix(parts[0].kind, np.concatenate([p.q for p in parts]), np.concatenate([p.d for p in parts]), m)

    def struct(self) -> _QMat:
        return _QMat(
            self.kind, self.rows, self.n, self.q.ctypes.data, self.d.ctypes.data, 0 if self.m is None else self.m.ctypes.data,
            None, None,
        )


@dataclass(frozen=True)
class FileTensor:
    """A 2-D tensor of a GGUF file as it lies there: ``raw``, its bytes as ``(rows, row_bytes)``
    (a view of the file's memory map, nothing read until used), its GGML type, and the order
    in which the model reads its rows (``order[i]``: the file row of HF row ``i``; llama.cpp
    stores the Q and K rows of its ``llama`` architecture rotary-permuted)."""

    name: str
    type_name: str
    raw: np.ndarray
    n: int
    order: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.raw.shape[0])

    @property
    def computed(self) -> bool:
        """Whether the C kernel computes this tensor's blocks as they are."""
        return self.type_name in COMPUTED_TYPES


class RawRows:
    """A ``(rows, n)`` matrix read from a GGUF file's blocks where they lie: one address and
    one GGML type per row (``csrc/blockdot.c``'s RAW kind), so tensors of several block types
    fuse into one product and permuted rows are read in place, without a copy. The products
    unpack each row's blocks and multiply them exactly (``raw_dot``)."""

    kind = RAW

    def __init__(self, parts: Sequence[FileTensor]) -> None:
        widths = {p.n for p in parts}
        if len(widths) != 1:
            raise ValueError(f"cannot fuse tensors of widths {sorted(widths)}")
        lib = library()
        addresses, kinds = [], []
        for p in parts:
            if not p.computed:
                raise ModelError(unsupported_message(p))
            if p.n % _block_values(p.type_name):
                raise ModelError(f"GGUF tensor {p.name}: rows of {p.n} values are not whole {p.type_name} blocks")
            row_bytes = int(lib.fak_block_bytes(COMPUTED_TYPES[p.type_name])) * p.n // _block_values(p.type_name)
            if p.raw.dtype != np.uint8 or p.raw.shape[1] != row_bytes or p.raw.strides != (row_bytes, 1):
                raise ModelError(f"GGUF tensor {p.name}: {p.raw.shape[1]} bytes a row, {row_bytes} expected for "
                                 f"{p.n} {p.type_name} values")
            rows = np.arange(p.rows, dtype=np.uint64) if p.order is None else p.order.astype(np.uint64)
            addresses.append(np.uint64(p.raw.ctypes.data) + rows * np.uint64(row_bytes))
            kinds.append(np.full(p.rows, COMPUTED_TYPES[p.type_name], dtype=np.uint8))
        self.parts = list(parts)  # the memory maps the addresses point into
        self.address = np.ascontiguousarray(np.concatenate(addresses))
        self.row_kind = np.ascontiguousarray(np.concatenate(kinds))
        self.n = parts[0].n

    @property
    def rows(self) -> int:
        return int(self.address.shape[0])

    @property
    def types(self) -> list[str]:
        return sorted({p.type_name for p in self.parts})

    def struct(self) -> _QMat:
        return _QMat(RAW, self.rows, self.n, None, None, None, self.address.ctypes.data, self.row_kind.ctypes.data)

    def dequantise(self) -> torch.Tensor:
        """Every row as float32 ``(rows, n)``, as ``BlockEmbedding`` reads rows (tests, tools)."""
        return BlockEmbedding(self)(torch.arange(self.rows))


def _block_values(type_name: str) -> int:
    return 256 if type_name.endswith("_K") else QK


def unsupported_message(t: FileTensor) -> str:
    """Why ``weights='gguf'`` refuses a tensor, and what runs it instead."""
    return (f"GGUF tensor {t.name} is {t.type_name}: weights='gguf' computes only the file's own "
            f"{', '.join(COMPUTED_TYPES)} blocks and never re-quantises another type; run this file with "
            "FAK_WEIGHTS=float32 (its blocks dequantised to floats) or FAK_WEIGHTS=float16")


class BlockEmbedding:
    """Token embeddings read from the embedding tensor's blocks (each asked row dequantised
    in C, ``w = sc * (u - off) + mn`` as ggml computes it): no float table in memory."""

    def __init__(self, matrix: RawRows) -> None:
        self.matrix = matrix
        self._struct = matrix.struct()
        self._lib = library()

    @property
    def struct(self) -> _QMat:
        return self._struct

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` (any shape of int64 ids in range), ``(*ids.shape, n)`` float32."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        if flat.numel() and not 0 <= int(flat.min()) <= int(flat.max()) < self.matrix.rows:
            raise ValueError(f"token ids must lie in [0, {self.matrix.rows})")  # the C reads row addresses by id
        out = torch.empty((int(flat.shape[0]), self.matrix.n), dtype=torch.float32)
        self._lib.fak_dequant_rows(ctypes.byref(self._struct), flat.data_ptr(), int(flat.shape[0]), out.data_ptr())
        return out.reshape(*ids.shape, self.matrix.n)


class BlockLinear:
    """``y = x @ W.T`` over a block matrix (the ``Linear`` protocol of ``kernel/model/quant.py``).

    One input row (a decode step, bound by reading the weights) runs the block kernel.
    Several rows (a prefill, bound by arithmetic) run ``F.linear`` on ``dense``, the float32
    matrix the blocks dequantise to, when given: the same weights, a BLAS GEMM, and float32
    inputs. Which path a call takes depends on its shape only, so the same calls still give
    the same bytes."""

    def __init__(self, w: BlockMatrix | RawRows, dense: torch.Tensor | None = None) -> None:
        if dense is not None and tuple(dense.shape) != (w.rows, w.n):
            raise ValueError(f"dense weights of shape {tuple(dense.shape)} for a {w.rows}x{w.n} block matrix")
        self.w = w
        self.dense = dense
        self.out_features = w.rows
        self._struct = w.struct()
        self._lib = library()

    @property
    def struct(self) -> ctypes.Structure:
        """The C descriptor of these blocks: the block decoder's layer table points at it."""
        return self._struct

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"block products take float32 inputs, not {x.dtype}")
        if self.dense is not None and x.numel() > self.w.n:  # several rows: a prefill call
            return torch.nn.functional.linear(x, self.dense)
        lead = x.shape[:-1]
        xs = x.reshape(-1, self.w.n).contiguous()
        m = int(xs.shape[0])
        y = torch.empty((m, self.w.rows), dtype=torch.float32)
        nb = self.w.n // QK
        xd, xsum = torch.empty(m * nb), torch.empty(m * nb)
        xq = torch.empty(2 * m * self.w.n, dtype=torch.int8)
        x16 = torch.empty(m * self.w.n, dtype=torch.int16)
        self._lib.fak_matmul(
            ctypes.byref(self._struct), xs.data_ptr(), m, y.data_ptr(), self.w.rows,
            xd.data_ptr(), xsum.data_ptr(), xq.data_ptr(), x16.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return y.reshape(*lead, self.w.rows)


# --- loading blocks ---------------------------------------------------------------------------


def gguf_blocks(file: GGUFFile | Path, cfg: ModelConfig) -> dict[str, FileTensor]:
    """Every 2-D tensor of the file that the model reads, HF-named, as it lies in the file's
    memory map (no bytes read until used), with the Q/K row order the model reads."""
    from fak.kernel.model.gguf_file import GGUFFile  # a GGUF file's reader: other formats never need it

    reader = file if isinstance(file, GGUFFile) else GGUFFile(file)
    out: dict[str, FileTensor] = {}
    for t in reader.tensors:
        key = hf_name(t.name, cfg.arch)
        if key is None or len(t.shape) != 2:
            continue
        n, rows = int(t.shape[0]), int(t.shape[1])
        raw = np.asarray(t.data).view(np.uint8).reshape(rows, -1)
        heads = rotary_heads(t.name, cfg)
        order = None if heads is None else unpermute(np.arange(rows), heads)
        out[key] = FileTensor(t.name, t.tensor_type.name, raw, n, order)
    return out


def tensors_by_type(tensors: dict[str, FileTensor]) -> dict[str, list[str]]:
    """The GGUF names of a file's weight matrices, by block type."""
    out: dict[str, list[str]] = {}
    for t in tensors.values():
        out.setdefault(t.type_name, []).append(t.name)
    return out


def computed_by(type_name: str, weight_format: str) -> str:
    """What computes a tensor of ``type_name`` in ``weight_format`` (``fak info``)."""
    if weight_format != "gguf":
        return f"dequantised to float32, then the {weight_format} format's products"
    if type_name in ("Q4_1", "Q8_0"):
        return "C block kernel over the file's own blocks (a matrix of this type alone: split layout, a copy)"
    if type_name in COMPUTED_TYPES:
        return "C block kernel over the file's own blocks, read in place (memory-mapped)"
    return "not computed by weights='gguf': the file is refused (run it with FAK_WEIGHTS=float32)"


def _split_blocks(t: FileTensor) -> BlockMatrix:
    """A Q4_1 or Q8_0 tensor in the split layout of kinds 0 and 1 (codes and scales apart)."""
    bm = BlockMatrix.from_gguf(t.type_name, t.raw, t.rows, t.n)
    return bm if t.order is None else bm.permute_rows(t.order)


def file_matrix(parts: Sequence[FileTensor]) -> BlockMatrix | RawRows:
    """The product over ``parts`` stacked by rows, computed from the file's own blocks: SmolLM2's
    all-Q4_1 or all-Q8_0 matrices in the split layout (its figures were measured there), any
    other mix of computed types read in place (``RawRows``); a type the kernel does not
    compute is refused by name (``ModelError``), never re-quantised."""
    for p in parts:
        if not p.computed:
            raise ModelError(unsupported_message(p))
    kinds = {p.type_name for p in parts}
    if kinds in ({"Q4_1"}, {"Q8_0"}):
        return BlockMatrix.cat([_split_blocks(p) for p in parts])
    return RawRows(parts)


def build_block_linears(
    cfg: ModelConfig, weights: Weights, blocks: dict[str, FileTensor] | None
) -> tuple[list[LayerLinears[BlockLinear]], BlockLinear]:
    """Every layer's four products and the LM head from the file's own blocks (``blocks``), or,
    for a model that is no GGUF file (``blocks`` None: HF folders, the tests' random models),
    Q8_0 of its float weights with prefill on those floats. A file's prefill runs the block
    kernel too: there is no float copy of its weights (``weights`` holds shapes only)."""
    if not blocks:
        def q8(w: torch.Tensor) -> BlockLinear:
            return BlockLinear(BlockMatrix.quantise_q8_0(w), w)

        return ([LayerLinears(q8(lw.wqkv), q8(lw.wo), q8(lw.w_gate_up), q8(lw.w_down)) for lw in weights.layers],
                q8(weights.lm_head))

    def tensor(name: str) -> FileTensor:
        t = blocks.get(name)
        if t is None:
            raise ModelError(f"the GGUF file has no tensor for {name}")
        return t

    def linear(*names: str) -> BlockLinear:
        return BlockLinear(file_matrix([tensor(n) for n in names]))

    layers: list[LayerLinears[BlockLinear]] = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        layers.append(LayerLinears(
            linear(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")),
            linear(p + "self_attn.o_proj.weight"),
            linear(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
            linear(p + "mlp.down_proj.weight"),
        ))  # fmt: skip
    head = "lm_head.weight" if "lm_head.weight" in blocks else "model.embed_tokens.weight"
    return layers, linear(head)


def block_embedding(blocks: dict[str, FileTensor] | None) -> BlockEmbedding | None:
    """The token embedding read from the file's blocks, where the kernel computes their type."""
    t = (blocks or {}).get("model.embed_tokens.weight")
    return BlockEmbedding(RawRows([t])) if t is not None and t.computed else None


# --- one decode step in C -------------------------------------------------------------------------


def _float_ptr(t: torch.Tensor) -> int:
    """The address of a contiguous float32 CPU vector the C step reads (biases, head norms)."""
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"the block decoder reads contiguous float32 CPU vectors, not {t.dtype} on {t.device}")
    return int(t.data_ptr())


class BlockDecoder:
    """One decode step over every layer in one C call (float32 KV cache only)."""

    def __init__(
        self, cfg: ModelConfig, weights: Weights, linears: list[LayerLinears[BlockLinear]], head: BlockLinear,
        embedding: BlockEmbedding | None = None,
    ) -> None:
        if cfg.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"the block decoder takes head_dim <= {MAX_HEAD_DIM}, not {cfg.head_dim}")
        self.cfg = cfg
        self._lib = library()
        self._keep = (weights, linears, head, embedding)  # the arrays and tensors the structs point into
        layers = (_Layer * cfg.num_layers)()
        for i, (lw, ln) in enumerate(zip(weights.layers, linears, strict=True)):
            extra = [None if t is None else _float_ptr(t) for t in (lw.qkv_bias, lw.q_norm, lw.k_norm)]
            layers[i] = _Layer(
                lw.attn_norm.data_ptr(), lw.mlp_norm.data_ptr(), ln.qkv.struct, ln.o.struct,
                ln.gate_up.struct, ln.down.struct, *extra,
            )  # fmt: skip
        self._layers = layers
        self._model = _Model(
            cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            head.out_features, cfg.rms_norm_eps, cfg.head_dim**-0.5,
            None if embedding is not None else _float_ptr(weights.embed),
            weights.norm.data_ptr(), head.struct, ctypes.addressof(layers),
            embedding.struct if embedding is not None else _QMat(),
        )  # fmt: skip
        self._local = threading.local()  # scratch per calling thread: sessions decode concurrently
        self.vocab = head.out_features

    def _scratch(self, rows: int) -> _Scratch:
        """This thread's step buffers, the attention scores' grown to ``rows`` keys."""
        cfg, local = self.cfg, self._local
        if not hasattr(local, "buf"):
            D, F = cfg.hidden_size, cfg.intermediate_size
            widest = max(D, F, cfg.num_heads * cfg.head_dim)
            local.buf = {
                "x": torch.empty(D),
                "h": torch.empty(widest),
                "qkv": torch.empty((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim),
                "att": torch.empty(cfg.num_heads * cfg.head_dim),
                "gu": torch.empty(2 * F),
                "xd": torch.empty(widest // QK + 1),
                "xs": torch.empty(widest // QK + 1),
                "scores": torch.empty(0),
                "xq": torch.empty(2 * widest, dtype=torch.int8),
            }
            local.struct = None
        b = local.buf
        need = cfg.num_heads * rows
        if local.struct is None or b["scores"].numel() < need:  # built once, again only when scores grow
            b["scores"] = torch.empty(max(need, 2 * b["scores"].numel()))
            local.struct = _Scratch(*(b[k].data_ptr() for k in ("x", "h", "qkv", "att", "gu", "xd", "xs", "scores", "xq")))
        struct: _Scratch = local.struct  # threading.local's attributes are untyped
        return struct

    def step(self, token: int, cache: KVCache, cos: torch.Tensor, sin: torch.Tensor,
             keep: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``token`` at cache row ``cache.length`` (room reserved by the caller); return
        its logits ``(1, vocab)``. ``keep``: the rows attended (a sliding window), None for all."""
        row = cache.length
        if row >= cache.capacity or cache.k.dtype != torch.float32 or not cache.k.is_contiguous():
            raise ValueError("the block decoder needs a reserved row in a contiguous float32 cache")
        scratch = self._scratch(row + 1)
        kb = _keep_bytes(keep)
        kv = _Cache(cache.k.data_ptr(), cache.kraw.data_ptr(), cache.v.data_ptr(), int(cache.k.shape[1]),
                    None if kb is None else kb.data_ptr())
        cos = cos.reshape(-1).contiguous()
        sin = sin.reshape(-1).contiguous()
        logits = torch.empty((1, self.vocab))
        self._lib.fak_decode_step(
            ctypes.byref(self._model), int(token), row, cos.data_ptr(), sin.data_ptr(), ctypes.byref(kv),
            ctypes.byref(scratch), logits.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return logits

    def step_batch(self, tokens: list[int], caches: list[KVCache], cos: torch.Tensor, sin: torch.Tensor,
                   keeps: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """Run one token of each of several sessions in one pass over the weights: ``tokens[t]``
        at row ``caches[t].length`` of its own cache (room reserved by the caller), with RoPE
        tables ``cos``/``sin`` ``(b, head_dim)``; their logits ``(b, vocab)``. Row ``t``'s cache
        rows and logits are the bytes ``step`` computes for it alone (``fak_decode_batch``)."""
        b = len(tokens)
        if b == 0 or len(caches) != b or tuple(cos.shape) != (b, self.cfg.head_dim) or cos.shape != sin.shape:
            raise ValueError("step_batch takes one token, one cache and one RoPE row per session")
        if len({id(c) for c in caches}) != b:
            raise ValueError("step_batch takes each cache at most once (a session decodes one token a step)")
        for c in caches:
            if c.length >= c.capacity or c.k.dtype != torch.float32 or not c.k.is_contiguous():
                raise ValueError("the block decoder needs a reserved row in a contiguous float32 cache")
        rows = [c.length for c in caches]
        scratch = self._batch_scratch(b, max(rows) + 1)
        kbs = [_keep_bytes(k) for k in (keeps or [None] * b)]  # held until the call returns
        kv = (_Cache * b)(*(_Cache(c.k.data_ptr(), c.kraw.data_ptr(), c.v.data_ptr(), int(c.k.shape[1]),
                                   None if kb is None else kb.data_ptr()) for c, kb in zip(caches, kbs, strict=True)))
        tok = torch.tensor(tokens, dtype=torch.int64)
        row = torch.tensor(rows, dtype=torch.int64)
        cos, sin = cos.contiguous(), sin.contiguous()
        logits = torch.empty((b, self.vocab))
        self._lib.fak_decode_batch(
            ctypes.byref(self._model), b, tok.data_ptr(), row.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            kv, ctypes.byref(scratch), logits.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return logits

    def _batch_scratch(self, b: int, keys: int) -> _BatchScratch:
        """This thread's batch buffers for ``b`` rows of up to ``keys`` cache rows (grown, never shrunk)."""
        cfg, local = self.cfg, self._local
        have = getattr(local, "batch", None)
        if have is not None and have[0] >= b and have[1] >= keys:
            struct: _BatchScratch = have[3]
            return struct
        b = max(b, have[0] if have else 0)
        keys = max(keys, 2 * (have[1] if have else 0), 256)
        D, F = cfg.hidden_size, cfg.intermediate_size
        widest = max(D, F, cfg.num_heads * cfg.head_dim)
        buf = {
            "x": torch.empty(b * D),
            "h": torch.empty(b * widest),
            "qkv": torch.empty(b * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim),
            "att": torch.empty(b * cfg.num_heads * cfg.head_dim),
            "gu": torch.empty(b * 2 * F),
            "xd": torch.empty(b * (widest // QK + 1)),
            "xs": torch.empty(b * (widest // QK + 1)),
            "scores": torch.empty(b * cfg.num_heads * keys),
            "xq": torch.empty(b * 2 * widest, dtype=torch.int8),
            "x16": torch.empty(b * widest, dtype=torch.int16),
        }
        struct = _BatchScratch(*(buf[k].data_ptr() for k in ("x", "h", "qkv", "att", "gu", "xd", "xs", "scores", "xq")),
                               cfg.num_heads * keys, buf["x16"].data_ptr())
        local.batch = (b, keys, buf, struct)
        return struct
