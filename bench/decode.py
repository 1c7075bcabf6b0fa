"""Prefill and decode throughput of fak per weight format (``--modes``) against
transformers ``generate()`` (float32, same weights) and, when the optional ``bench``
extra (llama-cpp-python) is installed, llama.cpp on the same GGUF file — all in
the same run, measured round-robin (one repetition of every peer, then the next)
so load from other work hits them alike; best of ``--repeat``. Greedy throughout.

Also reported: each mode's quality gap to float32 (teacher-forced over a fixed
prompt set, as one prefill and one token per call: argmax agreement and mean KL), whether fak float32 gives
transformers' greedy tokens, and (``--explain``) fak's torch decode path and one
bare pass of matrix-vector products over every weight, the floor of a step;
``--profile MODE`` prints where a decode step's time goes.

    python bench/decode.py [--json PATH] [--modes float32,float16,int8,bfloat16,gguf] [--threads N]
                           [--prefill-tokens 1024] [--prompt-tokens 256] [--new-tokens 128] [--repeat 3]
    python bench/decode.py --device cuda [--json PATH]   # fak float32 vs transformers on one GPU (cuda_main)
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

if "--threads" in sys.argv[:-1]:  # numpy's OpenBLAS (fak's float32 decode) reads this once, on import
    os.environ.setdefault("OPENBLAS_NUM_THREADS", sys.argv[sys.argv.index("--threads") + 1])

import numpy as np
import torch
from common import best_of, log, parser, report, target

from fak.kernel.model import blockdot
from fak.kernel.model.generate import SamplingParams, generate
from fak.kernel.model.llama import Llama
from fak.kernel.model.loader import load_model
from fak.kernel.model.quant import WEIGHT_FORMATS
from fak.kernel.model.weights import default_model_path

WORDS = ["agent", "tool", "result", "cache", "policy", "kernel", "token", "model", "span", "audit", "reference", "session", "tenant", "the", "a", "of", "and", "to", "in", "is", "for", "on", "with", "as", "by", "at", "from", "that", "this", "it", "be", "are", "was", "were", "has", "have", "search", "web", "page", "email", "file", "shell", "output", "request", "response", "server", "client", "data", "value", "error"]

# the fixed prompt set of the quality gap (tests/kernel/model/test_kernel_modes.py uses its first four)
QUALITY_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one paragraph.",
    "List three prime numbers greater than 100.",
    "Summarise: the meeting moved to Tuesday because the room was booked.",
    "Translate to French: good morning, how are you?",
    "Write a Python function that reverses a string.",
    "Why is the sky blue? Answer in two sentences.",
]
SERVING_DEFAULT = "gguf"  # the fast mode the targets are about


def prompt_ids(tokenizer, n: int, seed: int = 7) -> list[int]:  # noqa: ANN001
    rng = random.Random(seed)
    body = " ".join(rng.choice(WORDS) for _ in range(n * 2))
    text = tokenizer.render([{"role": "user", "content": "Summarise this tool output:\n" + body}], True)
    ids = tokenizer.encode(text)
    return ids[: n - 5] + tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n")


def bare_passes(model: Llama, repeat: int) -> dict[str, float]:
    """Seconds for one matrix-vector product with every weight matrix (no norms, no
    attention), through torch and through numpy, and for a plain read of those bytes."""
    mats = [t for lw in model.w.layers for t in (lw.wqkv, lw.wo, lw.w_gate_up, lw.w_down)] + [model.w.lm_head]
    vecs = {n: torch.randn(n) for n in {m.shape[1] for m in mats}}
    np_mats = [m.numpy() for m in mats]
    np_vecs = {n: v.numpy() for n, v in vecs.items()}
    flat = torch.cat([m.reshape(-1) for m in mats])
    fmt_passes = {}
    for fmt in ("float16", "int8"):
        lm = Llama(model.cfg, model.w, weight_format=fmt, decode="torch")
        lins = [f for ln in lm.lin for f in (ln.qkv, ln.o, ln.gate_up, ln.down)] + [lm.head]
        rows = {n: v[None] for n, v in vecs.items()}
        fmt_passes[fmt], _ = best_of(lambda lins=lins, rows=rows, mats=mats: [f(rows[m.shape[1]]) for f, m in zip(lins, mats, strict=True)], repeat * 5)
    t_torch, _ = best_of(lambda: [torch.mv(m, vecs[m.shape[1]]) for m in mats], repeat * 5)
    t_numpy, _ = best_of(lambda: [m @ np_vecs[m.shape[1]] for m in np_mats], repeat * 5)
    t_read, _ = best_of(lambda: float(flat.sum()), repeat * 5)
    return {"bytes": float(flat.numel() * flat.element_size()), "torch_mv": t_torch, "numpy_mv": t_numpy,
            "read": t_read, "float16_mv": fmt_passes["float16"], "int8_mv": fmt_passes["int8"]}


def _gap(a: torch.Tensor, b: torch.Tensor) -> tuple[int, torch.Tensor]:
    """argmax agreements and per-position KL(p_a ‖ p_b) of two log-softmax rows."""
    return int((a.argmax(-1) == b.argmax(-1)).sum()), (a.exp() * (a - b)).sum(-1)


def quality_gap(reference: Llama, model: Llama, tokenizer) -> dict[str, float]:  # noqa: ANN001
    """Teacher-forced over every position of each prompt, against float32's prefill: once
    as one prefill call, once one token per call (the decode path, which ``gguf`` runs in
    its block kernel and prefill does not). ``argmax_match`` and ``mean_kl`` are the
    worse of the two."""
    match = {"prefill": 0, "decode": 0}
    kls: dict[str, list[torch.Tensor]] = {"prefill": [], "decode": []}
    total = 0
    for p in QUALITY_PROMPTS:
        ids = tokenizer.encode(tokenizer.render([{"role": "user", "content": p}], True))
        a = reference.forward(ids, reference.new_cache(), all_logits=True).log_softmax(-1)
        cache = model.new_cache(len(ids) + 1)
        rows = {"prefill": model.forward(ids, model.new_cache(), all_logits=True),
                "decode": torch.cat([model.forward([t], cache) for t in ids])}
        for how, b in rows.items():
            m, kl = _gap(a, b.log_softmax(-1))
            match[how] += m
            kls[how].append(kl)
        total += len(ids)
    out: dict[str, float] = {}
    for how in ("prefill", "decode"):
        kl = torch.cat(kls[how])
        out |= {f"{how}_argmax_match": match[how] / total, f"{how}_mean_kl": float(kl.mean()),
                f"{how}_max_kl": float(kl.max())}
    out |= {"argmax_match": min(out["prefill_argmax_match"], out["decode_argmax_match"]),
            "mean_kl": max(out["prefill_mean_kl"], out["decode_mean_kl"]), "positions": total}
    return out


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the same GGUF: prefill with ``eval`` (batches of
    512), decode one ``eval`` per token with the argmax read straight from its logits."""

    def __init__(self, path: str, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=512, verbose=False)
        self.n_vocab = self.llm.n_vocab()
        self.version = getattr(llama_cpp, "__version__", "?")

    def argmax(self) -> int:
        """The argmax of the last evaluated position's logits (the decode loop reads it per token)."""
        ptr = self.lib.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return self.argmax()


def profile_decode(model: Llama, ids: list[int], steps: int = 32) -> None:
    """Where a decode step's time goes (torch profiler over ``steps`` steps)."""
    from torch.profiler import profile

    cache = model.new_cache(len(ids) + steps + 8)
    model.forward(ids, cache)
    for _ in range(4):
        model.forward([5], cache)
    with profile() as prof:
        for _ in range(steps):
            model.forward([5], cache)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def hf_greedy(hf: Any, pad_id: int | None, short_ids: list[int], device: str = "cpu",
              sync: Callable[[], None] = lambda: None
              ) -> tuple[Callable[[list[int], int], list[int]], Callable[[int], tuple[list[int], float]]]:
    """transformers' greedy ``generate(ids, n)`` on ``device``, and its decode of n tokens after
    ``short_ids`` timed as n tokens minus one token's run (generate() has no per-token hook)."""
    def hf_generate(ids: list[int], n: int) -> list[int]:
        with torch.inference_mode():
            out = hf.generate(torch.tensor([ids], device=device), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=pad_id)
        sync()
        return list(out[0, len(ids):].tolist())

    def hf_decode(n: int) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        hf_generate(short_ids, 1)
        t1 = time.perf_counter()
        out = hf_generate(short_ids, n)
        return out, max(time.perf_counter() - t1 - (t1 - t0), 1e-9)

    return hf_generate, hf_decode


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--modes", default=",".join(WEIGHT_FORMATS), help="weight formats, comma-separated")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch and llama.cpp threads")
    ap.add_argument("--prefill-tokens", type=int, default=1024)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when installed")
    ap.add_argument("--explain", action="store_true", help="also fak's torch decode path and bare passes")
    ap.add_argument("--profile", metavar="MODE", help="print a profile of MODE's decode step and exit")
    ap.add_argument("--device", default="cpu", help="cpu (default: every mode, llama.cpp) or cuda[:N] (fak float32 "
                                                    "against transformers on that GPU: cuda_main)")
    args = ap.parse_args()
    if args.device != "cpu":
        cuda_main(args)
        return
    modes = args.modes.split(",")
    for m in modes:
        if m not in WEIGHT_FORMATS:
            raise SystemExit(f"unknown mode {m!r}: one of {', '.join(WEIGHT_FORMATS)}")
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    log("loading fak models ...")
    ref_lm = load_model()
    tok, cfg = ref_lm.tokenizer, ref_lm.model.cfg
    path = default_model_path()
    blocks = blockdot.gguf_blocks(path, cfg) if "gguf" in modes else None
    models: dict[str, Llama] = {m: ref_lm.model if m == "float32" else
                                Llama(cfg, ref_lm.model.w, model_id=ref_lm.model.model_id, weight_format=m,
                                      blocks=blocks if m == "gguf" else None)
                                for m in modes}
    long_ids = prompt_ids(tok, args.prefill_tokens)
    short_ids = prompt_ids(tok, args.prompt_tokens)
    if args.profile:
        profile_decode(models.get(args.profile) or Llama(cfg, ref_lm.model.w, weight_format=args.profile), short_ids)
        return
    log("loading transformers peer from the same GGUF ...")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    llama = None
    if not args.no_llama_cpp:
        try:
            llama = LlamaCpp(str(path), args.threads, n_ctx=max(2048, len(long_ids) + 8))
        except ImportError:
            log("llama-cpp-python is not installed (pip install -e '.[bench]'): llama.cpp is not measured")
    eos = frozenset({tok.eos_token_id})

    def fak_prefill(m: Llama) -> int:
        cache = m.new_cache(len(long_ids) + 8)
        return int(m.forward(long_ids, cache).argmax())

    def fak_generate(m: Llama, n: int) -> tuple[list[int], float]:
        """Tokens, and the seconds of the n-1 decode steps after the first token."""
        cache = m.new_cache(len(short_ids) + n + 8)
        it = generate(m, cache, short_ids, SamplingParams(max_tokens=n, min_tokens=n, stop_token_ids=eos))
        out = [next(it)]
        t0 = time.perf_counter()
        out += list(it)
        return out, time.perf_counter() - t0

    hf_generate, hf_decode = hf_greedy(hf, tok.eos_token_id, short_ids)

    def llama_decode(n: int) -> tuple[list[int], float]:
        assert llama is not None
        out = [llama.prefill(short_ids)]
        t0 = time.perf_counter()
        for _ in range(n - 1):
            llama.llm.eval([out[-1]])
            out.append(llama.argmax())
        return out, time.perf_counter() - t0

    # every peer: (prefill of the long prompt, decode of new_tokens after the short one)
    peers: dict[str, tuple[Callable[[], object], Callable[[], tuple[list[int], float]]]] = {}
    for name, m in models.items():
        peers[f"fak-{name}"] = (lambda m=m: fak_prefill(m), lambda m=m: fak_generate(m, args.new_tokens))
    peers["transformers"] = (lambda: hf_generate(long_ids, 1), lambda: hf_decode(args.new_tokens))
    if llama is not None:
        peers["llama.cpp"] = (lambda: llama.prefill(long_ids), lambda: llama_decode(args.new_tokens))
    if args.explain and "float32" in models:
        torch_path = Llama(cfg, ref_lm.model.w, model_id=ref_lm.model.model_id, decode="torch")
        peers["fak-float32-torch-decode"] = (lambda: fak_prefill(torch_path),
                                             lambda: fak_generate(torch_path, args.new_tokens))

    log("warming up ...")
    for m in models.values():
        fak_generate(m, 4)
    if llama is not None:
        llama_decode(4)
    best: dict[str, list[float]] = {k: [float("inf")] * 2 for k in peers}
    tokens: dict[str, object] = {}
    for r in range(args.repeat):
        log(f"round {r + 1}/{args.repeat} ...")
        for name, (prefill, decode) in peers.items():
            t0 = time.perf_counter()
            prefill()
            best[name][0] = min(best[name][0], time.perf_counter() - t0)
            tokens[name], seconds = decode()
            best[name][1] = min(best[name][1], seconds)
    steps = args.new_tokens - 1
    rows = {name: {"prefill_tok_s": len(long_ids) / b[0], "decode_tok_s": steps / b[1]} for name, b in best.items()}

    log("quality gap to float32 ...")
    reference = ref_lm.model
    quality = {m: quality_gap(reference, model, tok) for m, model in models.items() if m != "float32"}
    bare = bare_passes(reference, args.repeat) if args.explain else None

    hf_tokens = tokens["transformers"]
    results: dict[str, object] = {
        "model": path.name, "threads": args.threads, "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "prefill_tokens": len(long_ids), "prompt_tokens": len(short_ids), "new_tokens": args.new_tokens,
        "repeat": args.repeat, "peers": rows, "quality_vs_float32": quality,
        "llama_cpp": llama.version if llama else None,
        # transformers exposes the resolved attention backend only as this attribute
        "hf_attn_implementation": hf.config._attn_implementation,  # noqa: SLF001
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for name in rows:
        if name.startswith("fak-"):
            rows[name]["decode_vs_transformers"] = rows[name]["decode_tok_s"] / rows["transformers"]["decode_tok_s"]
            rows[name]["prefill_vs_transformers"] = rows[name]["prefill_tok_s"] / rows["transformers"]["prefill_tok_s"]
            if llama is not None:
                rows[name]["decode_vs_llama_cpp"] = rows[name]["decode_tok_s"] / rows["llama.cpp"]["decode_tok_s"]
                rows[name]["prefill_vs_llama_cpp"] = rows[name]["prefill_tok_s"] / rows["llama.cpp"]["prefill_tok_s"]
            rows[name]["greedy_tokens_equal_transformers"] = tokens[name] == hf_tokens
    if llama is not None:
        rows["llama.cpp"]["greedy_tokens_equal_transformers"] = tokens["llama.cpp"] == hf_tokens
    if bare is not None:
        results["bare_pass_tok_s"] = {k: 1 / v for k, v in bare.items() if k != "bytes"}
        results["weight_bytes_float32"] = bare["bytes"]

    print(f"\nthreads={args.threads}  prefill {len(long_ids)} tokens; decode {args.new_tokens} after {len(short_ids)}")
    print(f"{'':<26}{'prefill tok/s':>14}{'decode tok/s':>14}{'dec/llama':>11}{'pre/llama':>11}{'dec/hf':>9}")
    for name, row in rows.items():
        print(f"{name:<26}{row['prefill_tok_s']:>14.1f}{row['decode_tok_s']:>14.2f}"
              f"{row.get('decode_vs_llama_cpp', float('nan')):>11.3f}{row.get('prefill_vs_llama_cpp', float('nan')):>11.3f}"
              f"{row.get('decode_vs_transformers', float('nan')):>9.3f}")
    for m, q in quality.items():
        print(f"quality {m:<9} vs float32 over {q['positions']} positions: prefill argmax {q['prefill_argmax_match']:.3f} "
              f"KL {q['prefill_mean_kl']:.2e}; decode argmax {q['decode_argmax_match']:.3f} KL {q['decode_mean_kl']:.2e}")

    targets = []
    if "fak-float32" in rows:
        f32 = rows["fak-float32"]
        targets += [
            target("float32_decode_vs_transformers", f32["decode_vs_transformers"], 1.25, ">="),
            target("float32_prefill_vs_transformers", f32["prefill_vs_transformers"], 1.0, ">="),
            target("float32_greedy_tokens_equal_transformers", float(f32["greedy_tokens_equal_transformers"]), 1.0, ">="),
        ]
    for m in (SERVING_DEFAULT,):
        if f"fak-{m}" not in rows:
            continue
        row = rows[f"fak-{m}"]
        if llama is not None:
            targets += [target(f"{m}_decode_vs_llama_cpp", row["decode_vs_llama_cpp"], 1.0, ">="),
                        target(f"{m}_prefill_vs_llama_cpp", row["prefill_vs_llama_cpp"], 1.0, ">=")]
        targets.append(target(f"{m}_argmax_match_vs_float32", quality[m]["argmax_match"], 0.98, ">="))
    report("decode", results, targets, args.json)


def cuda_main(args) -> None:  # noqa: ANN001 - argparse's namespace
    """``--device cuda[:N]``: fak float32 (torch prefill and torch decode, KV cache on the GPU) against
    transformers float32 (its default attention) on the same GPU, in the same run, round-robin,
    best of ``--repeat``, CUDA synchronised around every timed call. Both run under the
    determinism switches fak sets on CUDA (``kernel/model/device.py``: deterministic algorithms,
    no TF32, the cuBLAS workspace), which are process-wide. Also reported: the long prompt's last
    logits against transformers' (max|Δ|, same argmax) and whether greedy tokens are equal."""
    from fak.kernel.model import device as devices

    try:
        device = devices.resolve(args.device)  # refuses without CUDA; the switches are set before any CUDA work
    except devices.DeviceError as exc:
        raise SystemExit(f"bench/decode.py: {exc}") from None
    sync = torch.cuda.synchronize
    torch.manual_seed(0)
    log(f"loading fak float32 on {device} ...")
    lm = load_model(device=device)
    model, tok = lm.model, lm.tokenizer
    path = default_model_path()
    long_ids = prompt_ids(tok, args.prefill_tokens)
    short_ids = prompt_ids(tok, args.prompt_tokens)
    log("loading transformers peer from the same GGUF onto the same GPU ...")
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    hf = hf.eval().to(device)
    eos = frozenset({tok.eos_token_id})

    def fak_prefill() -> torch.Tensor:
        out = model.forward(long_ids, model.new_cache(len(long_ids) + 8))
        sync()
        return out

    def fak_generate(n: int) -> tuple[list[int], float]:
        cache = model.new_cache(len(short_ids) + n + 8)
        it = generate(model, cache, short_ids, SamplingParams(max_tokens=n, min_tokens=n, stop_token_ids=eos))
        out = [next(it)]
        sync()
        t0 = time.perf_counter()
        out += list(it)
        sync()
        return out, time.perf_counter() - t0

    def hf_prefill() -> torch.Tensor:
        with torch.inference_mode():
            out = hf(torch.tensor([long_ids], device=device), use_cache=True, logits_to_keep=1).logits[0]
        sync()
        return out

    hf_generate, hf_decode = hf_greedy(hf, tok.eos_token_id, short_ids, device, sync)

    peers = {"fak-float32": (fak_prefill, lambda: fak_generate(args.new_tokens)),
             "transformers": (hf_prefill, lambda: hf_decode(args.new_tokens))}
    log("warming up ...")
    fak_generate(4)
    hf_decode(4)
    fak_prefill()
    hf_prefill()
    best: dict[str, list[float]] = {k: [float("inf")] * 2 for k in peers}
    tokens: dict[str, list[int]] = {}
    last: dict[str, torch.Tensor] = {}
    for r in range(args.repeat):
        log(f"round {r + 1}/{args.repeat} ...")
        for name, (prefill, decode) in peers.items():
            t0 = time.perf_counter()
            last[name] = prefill()
            best[name][0] = min(best[name][0], time.perf_counter() - t0)
            tokens[name], seconds = decode()
            best[name][1] = min(best[name][1], seconds)
    steps = args.new_tokens - 1
    rows = {name: {"prefill_tok_s": len(long_ids) / b[0], "decode_tok_s": steps / b[1]} for name, b in best.items()}
    ours, ref = last["fak-float32"][-1].float().cpu(), last["transformers"][-1].float().cpu()
    f32 = rows["fak-float32"]
    f32["decode_vs_transformers"] = f32["decode_tok_s"] / rows["transformers"]["decode_tok_s"]
    f32["prefill_vs_transformers"] = f32["prefill_tok_s"] / rows["transformers"]["prefill_tok_s"]
    f32["greedy_tokens_equal_transformers"] = tokens["fak-float32"] == tokens["transformers"]
    f32["prefill_last_logits_max_abs_diff"] = float((ours - ref).abs().max())
    f32["prefill_last_argmax_equal"] = int(ours.argmax()) == int(ref.argmax())
    results: dict[str, object] = {
        "model": path.name, "device": str(device), "gpu": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda, "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32": torch.backends.cuda.matmul.allow_tf32, "fak_decode_path": model.decode,
        "prefill_tokens": len(long_ids), "prompt_tokens": len(short_ids), "new_tokens": args.new_tokens,
        "repeat": args.repeat, "peers": rows,
        # transformers exposes the resolved attention backend only as this attribute
        "hf_attn_implementation": hf.config._attn_implementation,  # noqa: SLF001
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    print(f"\n{device} ({results['gpu']}): prefill {len(long_ids)} tokens; decode {args.new_tokens} after {len(short_ids)}")
    print(f"{'':<16}{'prefill tok/s':>14}{'decode tok/s':>14}")
    for name, row in rows.items():
        print(f"{name:<16}{row['prefill_tok_s']:>14.1f}{row['decode_tok_s']:>14.2f}")
    targets = [
        target("cuda_float32_decode_vs_transformers", f32["decode_vs_transformers"], 1.0, ">="),
        target("cuda_float32_prefill_vs_transformers", f32["prefill_vs_transformers"], 1.0, ">="),
        target("cuda_float32_greedy_tokens_equal_transformers", float(f32["greedy_tokens_equal_transformers"]), 1.0,
               ">="),
        target("cuda_float32_prefill_argmax_equal_transformers", float(f32["prefill_last_argmax_equal"]), 1.0, ">="),
    ]
    report("decode", results, targets, args.json)


if __name__ == "__main__":
    main()
