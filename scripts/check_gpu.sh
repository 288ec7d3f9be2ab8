#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU whose Python already has
# JAX with its CUDA plugin (no network needed): installs hostcb into that
# Python, then
#   engine: tests/test_gpu.py on the GPU (JAX_PLATFORMS=cuda,cpu) with the
#           engine's GPU back end (HOSTCB_GPU_ENGINE=1),
#   tests:  the same with XLA's Python callbacks for GPUs (the default),
#   bench:  the tap benchmark on the GPU (fewer steps: GPU callbacks cost
#           more), both ways in one run,
#   suite:  the whole suite on that machine's CPU, with its JAX version
#           (not run unless named: it needs no GPU).
# Logs go to $OUT (default /tmp/hostcb-gpu); each part has its own time
# limit (the default parts fit in one 10-minute device command), pytest
# names each test (-v) and dumps every thread's stack if one test runs
# past 60 s, and a summary is printed last.
#
#     bash scripts/check_gpu.sh [parts: engine tests bench suite]
set -uo pipefail
OUT=${OUT:-/tmp/hostcb-gpu}
PY=${PYTHON:-python3}
PARTS=${*:-engine tests bench}
PYTEST="$PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=60"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
summary=()

$PY -m pip install -q --no-deps --no-build-isolation --no-cache-dir \
    --force-reinstall . >"$OUT/install.log" 2>&1 \
  || { cat "$OUT/install.log"; exit 1; }
JAX_PLATFORMS=cuda,cpu $PY - <<'EOF' 2>&1 | tee "$OUT/versions.log"
import jax, jaxlib, numpy
from hostcb import engine
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "numpy",
      numpy.__version__, "devices", jax.devices(), "cpu", jax.devices("cpu"))
print("native engine:", engine.available() or engine.unavailable_reason())
from hostcb.engine import gpu
print("GPU engine:", gpu.available(2**28) or gpu.unavailable_reason())
EOF
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
  | tee -a "$OUT/versions.log"

for part in $PARTS; do
  case $part in
    tests)
      JAX_PLATFORMS=cuda,cpu timeout 170 $PYTEST tests/test_gpu.py \
          >"$OUT/gpu_tests.log" 2>&1
      summary+=("gpu tests: rc $? $(tail -1 "$OUT/gpu_tests.log")") ;;
    engine)
      HOSTCB_GPU_ENGINE=1 JAX_PLATFORMS=cuda,cpu timeout 170 $PYTEST \
          tests/test_gpu.py >"$OUT/gpu_engine_tests.log" 2>&1
      summary+=("gpu engine tests: rc $? $(tail -1 "$OUT/gpu_engine_tests.log")") ;;
    bench)
      JAX_PLATFORMS=cuda,cpu timeout 170 $PY benchmarks/bench_tap.py \
          --steps 2000 --taps 100000 >"$OUT/gpu_bench.log" 2>&1
      summary+=("gpu bench: rc $?") ;;
    suite)
      HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=4 timeout 480 \
          $PY -m pytest -q -p no:cacheprovider --maxfail=30 tests \
          --deselect tests/test_legacy_diff.py >"$OUT/cpu_suite.log" 2>&1
      summary+=("cpu suite: rc $? $(tail -1 "$OUT/cpu_suite.log")") ;;
  esac
done

for f in "$OUT"/gpu_tests.log "$OUT"/gpu_engine_tests.log "$OUT"/cpu_suite.log; do
  [ -f "$f" ] && { echo "== $f"; grep -E "^(FAILED|ERROR)|Error" "$f" | head -40; }
done
[ -f "$OUT/gpu_bench.log" ] && cat "$OUT/gpu_bench.log"
printf '%s\n' "${summary[@]}"
