"""bench/peer_build.py: the CMAKE_ARGS the llama.cpp peer is built with (issue 44's AMX trap)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import peer_build  # noqa: E402

SAPPHIRE = ("fpu sse4_2 avx avx2 fma f16c avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 avx512vbmi "
            "amx_bf16 amx_tile amx_int8")


def test_a_cpu_reporting_amx_gets_a_non_native_build_with_amx_off() -> None:
    args, reason = peer_build.cmake_args(peer_build.cpu_flags(f"processor : 0\nflags\t\t: {SAPPHIRE}\n"), "x86_64")
    words = args.split()
    # the arguments the issue found to run, each present
    for need in ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                 "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_TILE=OFF",
                 "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"):
        assert need in words, need
    assert "-DGGML_AVX_VNNI=OFF" in words  # not reported: not asked for
    assert "AMX" in reason


def test_only_the_extensions_the_cpu_reports_are_switched_on() -> None:
    args, _ = peer_build.cmake_args({"avx", "avx2", "fma", "f16c", "amx_tile"}, "x86_64")
    assert "-DGGML_AVX512=OFF" in args.split() and "-DGGML_AVX2=ON" in args.split()


def test_without_amx_or_off_x86_the_build_is_llama_cpp_s_native_one() -> None:
    assert peer_build.cmake_args({"avx", "avx2", "avx512f", "avx512_vnni"}, "x86_64")[0] == ""
    assert peer_build.cmake_args({"amx_tile"}, "aarch64")[0] == ""
    assert peer_build.cpu_flags("") == set()


def test_the_pinned_requirement_is_the_bench_extra_s() -> None:
    assert peer_build.requirement().startswith("llama-cpp-python==")
