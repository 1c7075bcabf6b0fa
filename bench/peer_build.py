"""The CMAKE_ARGS the llama.cpp peer (llama-cpp-python, the `bench` extra) is built with on this CPU.

Why: llama-cpp-python 0.3.36 built natively (GGML_NATIVE=ON, its default) on a host whose CPU
reports AMX compiles ggml's AMX backend, and on the hosts this project runs on that backend dies
with SIGILL (`tileloadd` in `ggml_backend_amx_mul_mat`) on any batched eval: every prefill
comparison fails (issue 44). Where /proc/cpuinfo reports AMX, this script asks for a non-native
build with the x86 extensions the CPU does report named explicitly and AMX off; elsewhere it asks
for nothing (the native build, llama.cpp's own choice).

Usage:
    python bench/peer_build.py            # prints the CMAKE_ARGS for this CPU (possibly empty)
    python bench/peer_build.py --explain  # also says why, on stderr
    python bench/peer_build.py --install  # builds and installs the peer with them (`make bench`)

``--install`` (the Makefile's `bench` target) builds the `bench` extra's pinned llama-cpp-python
from source into this Python's environment with those CMAKE_ARGS (~10 min on 2 cores), without
pip's wheel cache (it does not key on CMAKE_ARGS, so a native wheel built once would come back),
and records them in ``<venv>/.peer-cmake-args``; it does nothing when the peer is installed and
was built with the same arguments, and rebuilds when they differ (a native build on an AMX host).
bench/sizes.py records that file, this CPU's arguments and llama.cpp's own system_info in its JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = Path(sys.prefix) / ".peer-cmake-args"

# ggml's CMake switch for each /proc/cpuinfo flag, in the order llama.cpp lists them
X86_SWITCHES: tuple[tuple[str, str], ...] = (
    ("avx", "GGML_AVX"),
    ("avx2", "GGML_AVX2"),
    ("fma", "GGML_FMA"),
    ("f16c", "GGML_F16C"),
    ("avx512f", "GGML_AVX512"),
    ("avx512_vnni", "GGML_AVX512_VNNI"),
    ("avx512_bf16", "GGML_AVX512_BF16"),
    ("avx512vbmi", "GGML_AVX512_VBMI"),
    ("avx_vnni", "GGML_AVX_VNNI"),
)
AMX_SWITCHES: tuple[str, ...] = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU listed in a /proc/cpuinfo text (empty if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cmake_args(flags: set[str], machine: str) -> tuple[str, str]:
    """(CMAKE_ARGS, reason) for a CPU with these flags on this machine architecture."""
    if machine not in ("x86_64", "AMD64"):
        return "", f"{machine}: native build (the AMX trap is x86 only)"
    amx = sorted(f for f in flags if f.startswith("amx"))
    if not amx:
        return "", "no AMX reported: native build (GGML_NATIVE=ON, llama.cpp's default)"
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{switch}={'ON' if flag in flags else 'OFF'}" for flag, switch in X86_SWITCHES]
    args += [f"-D{switch}=OFF" for switch in AMX_SWITCHES]
    reason = (
        f"CPU reports {' '.join(amx)}: non-native build, explicit x86 extensions, AMX off "
        "(ggml's AMX backend dies with SIGILL on batched evals on these hosts, issue 44)"
    )
    return " ".join(args), reason


def requirement() -> str:
    """The `bench` extra's pin of llama-cpp-python, from pyproject.toml."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    return next(r for r in extra if r.startswith("llama-cpp-python"))


def install(args: str) -> int:
    """Build and install the peer with ``args`` unless it is installed and built with them already."""
    built = RECORD.read_text().strip() if RECORD.is_file() else None
    present = importlib.util.find_spec("llama_cpp") is not None
    if present and (built == args or (built is None and not args)):
        print(f"peer_build: {requirement()} is installed, built with CMAKE_ARGS={args!r}", file=sys.stderr)
        return 0
    print(f"peer_build: building {requirement()} from source with CMAKE_ARGS={args!r} (~10 min on 2 cores)",
          file=sys.stderr, flush=True)
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    env = dict(os.environ, CMAKE_ARGS=args)
    done = subprocess.run([*pip, "--no-cache-dir", "--force-reinstall", "--no-deps", requirement()], env=env)
    if done.returncode == 0:  # its own dependencies, from the extra
        done = subprocess.run([*pip, "-e", f"{ROOT}[bench]"])
    if done.returncode != 0:
        return done.returncode
    RECORD.write_text(args + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpuinfo", default="/proc/cpuinfo", help="read the CPU flags from this file")
    parser.add_argument("--explain", action="store_true", help="say why on stderr")
    parser.add_argument("--install", action="store_true", help="build and install the peer with them (make bench)")
    args = parser.parse_args()
    path = Path(args.cpuinfo)
    text = path.read_text() if path.exists() else ""
    value, reason = cmake_args(cpu_flags(text), platform.machine())
    if args.explain or args.install:
        print(f"peer_build: {reason}", file=sys.stderr)
    if args.install:
        return install(value)
    print(value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
