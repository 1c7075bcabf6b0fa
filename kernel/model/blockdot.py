"""The ``gguf`` weight format: products over the model file's own quantised blocks.

A GGUF file stores SmolLM2's layers as Q4_1 blocks and its embedding (the tied LM
head) as Q8_0; the float32 reference computes with their dequantisation. This
format keeps those blocks as they are (``Q4_1``: 4-bit codes, a float16 scale and
minimum per 32 weights; ``Q8_0``: int8 codes and a float16 scale) and runs the
decode products in C (``csrc/blockdot.c``): the input row is quantised in blocks
of 32 to two int8 codes (~15 bits, where llama.cpp keeps 8) and each block's
integer dot product is exact. So a decode step reads the reference's weights
exactly, at 4.5 bits each, and only the inputs of its products are rounded.
Prefill, bound by arithmetic rather than by reading weights, runs the float32
reference's own products over the dequantised blocks (``BlockLinear``). Tensors of
other block types, and models that are not GGUF files (HF folders, the tests'
random models), are quantised to Q8_0.

The C file is compiled on first use with the system's C compiler (``cc -O3
-march=native -fopenmp``) into the cache directory, keyed by its source, the
flags and the CPU, and loaded with ctypes; a machine without a compiler gets a clear error,
and the other formats still work. One decode step is one C call (every layer,
threads split rows and heads), so Python's per-op overhead is gone from decoding.
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
from typing import Literal

import numpy as np
import torch

from fak.kernel.model.config import ModelConfig, ModelError
from fak.kernel.model.gguf_names import hf_name, rotary_heads, unpermute
from fak.kernel.model.kv_cache import KVCache
from fak.kernel.model.params import Weights
from fak.kernel.model.quant import LayerLinears, cpu_flags, fbgemm_supported
from fak.settings import StorageSettings

QK = 32
Q4_1, Q8_0 = 0, 1
SOURCE = Path(__file__).with_name("csrc") / "blockdot.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11")
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
        # fak_matmul(w, x, m, y, ldy, xd, xs, xq, nthreads)
        lib.fak_matmul.argtypes = (ptr, ptr, i64, ptr, i64, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_matmul.restype = None
        # fak_decode_step(model, token, row, cos, sin_signed, cache, scratch, logits, nthreads)
        lib.fak_decode_step.argtypes = (ptr, i64, i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_decode_step.restype = None
        # fak_decode_batch(model, b, tokens, rows, cos, sin_signed, caches, scratch, logits, nthreads)
        lib.fak_decode_batch.argtypes = (ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ctypes.c_int)
        lib.fak_decode_batch.restype = None
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
            self.kind, self.rows, self.n, self.q.ctypes.data, self.d.ctypes.data, 0 if self.m is None else self.m.ctypes.data
        )


class BlockLinear:
    """``y = x @ W.T`` over a block matrix (the ``Linear`` protocol of ``kernel/model/quant.py``).

    One input row (a decode step, bound by reading the weights) runs the block kernel.
    Several rows (a prefill, bound by arithmetic) run ``F.linear`` on ``dense``, the float32
    matrix the blocks dequantise to, when given: the same weights, a BLAS GEMM, and float32
    inputs. Which path a call takes depends on its shape only, so the same calls still give
    the same bytes."""

    def __init__(self, w: BlockMatrix, dense: torch.Tensor | None = None) -> None:
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
        self._lib.fak_matmul(
            ctypes.byref(self._struct), xs.data_ptr(), m, y.data_ptr(), self.w.rows,
            xd.data_ptr(), xsum.data_ptr(), xq.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return y.reshape(*lead, self.w.rows)


# --- loading blocks ---------------------------------------------------------------------------


def gguf_blocks(path: Path, cfg: ModelConfig) -> dict[str, BlockMatrix]:
    """The blocks of every tensor the kernel can run as it is, HF-named, Q/K rows in HF order
    (llama.cpp stores them rotary-permuted, as ``gguf_names.unpermute`` undoes for floats)."""
    from gguf import GGUFReader  # imported where a GGUF file is read (~0.2 s): other formats never need it

    reader = GGUFReader(str(path))
    out: dict[str, BlockMatrix] = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        if kind not in ("Q4_1", "Q8_0") or len(t.shape) != 2:
            continue
        key = hf_name(t.name)
        if key is None:
            continue
        n, rows = int(t.shape[0]), int(t.shape[1])
        bm = BlockMatrix.from_gguf(kind, t.data, rows, n)
        heads = rotary_heads(t.name, cfg)
        if heads is not None:
            bm = bm.permute_rows(unpermute(np.arange(rows), heads))
        out[key] = bm
    return out


def build_block_linears(
    cfg: ModelConfig, weights: Weights, blocks: dict[str, BlockMatrix] | None
) -> tuple[list[LayerLinears[BlockLinear]], BlockLinear]:
    """Every layer's four products and the LM head as block matrices: the file's own blocks
    where ``blocks`` has them, Q8_0 of the float weights elsewhere. Prefill calls run on the
    float weights (``BlockLinear``), which are the blocks' dequantisation for a GGUF model."""
    blocks = blocks or {}

    def get(name: str, fallback: torch.Tensor) -> BlockMatrix:
        return blocks.get(name) or BlockMatrix.quantise_q8_0(fallback)

    def fused(parts: list[tuple[str, torch.Tensor]]) -> BlockMatrix:
        mats = [get(n, w) for n, w in parts]
        if len({m.kind for m in mats}) > 1:
            mats = [BlockMatrix.quantise_q8_0(w) for _, w in parts]
        return BlockMatrix.cat(mats)

    layers: list[LayerLinears[BlockLinear]] = []
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        qkv = fused([(p + "self_attn.q_proj.weight", lw.wq), (p + "self_attn.k_proj.weight", lw.wk),
                     (p + "self_attn.v_proj.weight", lw.wv)])  # fmt: skip
        gate_up = fused([(p + "mlp.gate_proj.weight", lw.w_gate), (p + "mlp.up_proj.weight", lw.w_up)])
        o = get(p + "self_attn.o_proj.weight", lw.wo)
        down = get(p + "mlp.down_proj.weight", lw.w_down)
        layers.append(LayerLinears(*(BlockLinear(m, d) for m, d in
                                     ((qkv, lw.wqkv), (o, lw.wo), (gate_up, lw.w_gate_up), (down, lw.w_down)))))  # fmt: skip
    tied = weights.lm_head is weights.embed
    head = blocks.get("lm_head.weight") or (blocks.get("model.embed_tokens.weight") if tied else None)
    return layers, BlockLinear(head or BlockMatrix.quantise_q8_0(weights.lm_head), weights.lm_head)


# --- one decode step in C -------------------------------------------------------------------------


def _float_ptr(t: torch.Tensor) -> int:
    """The address of a contiguous float32 CPU vector the C step reads (biases, head norms)."""
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError(f"the block decoder reads contiguous float32 CPU vectors, not {t.dtype} on {t.device}")
    return int(t.data_ptr())


class BlockDecoder:
    """One decode step over every layer in one C call (float32 KV cache only)."""

    def __init__(
        self, cfg: ModelConfig, weights: Weights, linears: list[LayerLinears[BlockLinear]], head: BlockLinear
    ) -> None:
        if cfg.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"the block decoder takes head_dim <= {MAX_HEAD_DIM}, not {cfg.head_dim}")
        self.cfg = cfg
        self._lib = library()
        self._keep = (weights, linears, head)  # the arrays and tensors the structs point into
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
            head.out_features, cfg.rms_norm_eps, cfg.head_dim**-0.5, weights.embed.data_ptr(),
            weights.norm.data_ptr(), head.struct, ctypes.addressof(layers),
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
