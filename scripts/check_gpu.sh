#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU whose Python already has
# JAX with its CUDA plugin (no network needed): installs hostcb into that
# Python (the wheel HOSTCB_WHEEL names, as users get it, or else built from
# this tree), then
#   engine:  tests/test_gpu.py on the GPU (JAX_PLATFORMS=cuda,cpu) with the
#            engine's GPU back end (HOSTCB_GPU_ENGINE=1, the default),
#   tests:   the same with XLA's Python callbacks for GPUs
#            (HOSTCB_GPU_ENGINE=0); "engine" and "tests" run side by side
#            (neither preallocates GPU memory),
#   fake:    tests/test_engine_gpu.py on that machine's CPU (the simulated
#            driver; there it also checks cuda_api.h against cuda.h),
#   bench:   the tap benchmark on the GPU (fewer steps: GPU callbacks cost
#            more), both ways in one run,
#   dropins: JAX's callbacks against hostcb's drop-ins on the GPU
#            (benchmarks/bench_jax_callbacks.py --quick, GPU engine on),
#   suite:   the whole suite on that machine's CPU, with its JAX version
#            (not run unless named: it needs no GPU); it starts first and
#            runs beside the test parts (SUITE_TIMEOUT seconds, default
#            420), and the benchmarks wait for it.
# Logs go to $OUT (default /tmp/hostcb-gpu); each part has its own time
# limit (PART_TIMEOUT seconds, default 170; the default parts fit in one
# 10-minute device command), pytest names each test (-v) and dumps every
# thread's stack if one test runs past 60 s, and a summary is printed last.
#
#     [HOSTCB_WHEEL=dist/hostcb-...whl] bash scripts/check_gpu.sh \
#         [parts: engine tests bench dropins suite]
set -uo pipefail
OUT=${OUT:-/tmp/hostcb-gpu}
PY=${PYTHON:-python3}
PARTS=${*:-engine tests fake bench dropins}
LIMIT=${PART_TIMEOUT:-170}
PYTEST="$PY -m pytest -v -p no:cacheprovider -o faulthandler_timeout=60"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
summary=()

# Built from this tree: the test build of the native engine (the "fake"
# part drives its simulated driver; "bench" times taps published by host
# functions too).  A wheel is the production build: "fake" then skips (its
# tests say why), and the benchmark leaves those rows out.
if [ -n "${HOSTCB_WHEEL:-}" ]; then
  what=$HOSTCB_WHEEL
else
  what=.
  export HOSTCB_TEST_BUILD=1
fi
$PY -m pip install -q --no-deps --no-build-isolation --no-cache-dir \
    --force-reinstall "$what" >"$OUT/install.log" 2>&1 \
  || { cat "$OUT/install.log"; exit 1; }
echo "installed: $what" | tee "$OUT/versions.log"
JAX_PLATFORMS=cuda,cpu $PY - <<'EOF' 2>&1 | tee -a "$OUT/versions.log"
import jax, jaxlib, numpy
from hostcb import _engine as engine
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "numpy",
      numpy.__version__, "devices", jax.devices(), "cpu", jax.devices("cpu"))
print("native engine:", engine.available() or engine.unavailable_reason())
from hostcb._engine import gpu
print("GPU engine:", gpu.available(2**28) or gpu.unavailable_reason())
EOF
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader \
  | tee -a "$OUT/versions.log"

has() { [[ " $PARTS " == *" $1 "* ]]; }
suite_pid=
if has suite; then
  JAX_PLATFORMS=cpu HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=4 \
      timeout "${SUITE_TIMEOUT:-420}" $PY -m pytest -q -p no:cacheprovider \
      --maxfail=30 tests --deselect tests/test_legacy_diff.py \
      >"$OUT/cpu_suite.log" 2>&1 &
  suite_pid=$!
fi
# The two test runs share the GPU: no preallocation, side by side.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
pids=()
if has engine; then
  HOSTCB_GPU_ENGINE=1 JAX_PLATFORMS=cuda,cpu timeout "$LIMIT" $PYTEST \
      tests/test_gpu.py >"$OUT/gpu_engine_tests.log" 2>&1 &
  pids+=("$!:gpu engine tests:$OUT/gpu_engine_tests.log")
fi
if has tests; then
  HOSTCB_GPU_ENGINE=0 JAX_PLATFORMS=cuda,cpu timeout "$LIMIT" $PYTEST \
      tests/test_gpu.py >"$OUT/gpu_tests.log" 2>&1 &
  pids+=("$!:gpu tests:$OUT/gpu_tests.log")
fi
for p in "${pids[@]}"; do
  IFS=: read -r pid name log <<<"$p"
  wait "$pid"
  summary+=("$name: rc $? $(tail -1 "$log")")
done
if has fake; then
  JAX_PLATFORMS=cpu timeout "$LIMIT" $PYTEST tests/test_engine_gpu.py \
      >"$OUT/fake_driver_tests.log" 2>&1
  summary+=("simulated-driver tests: rc $? $(tail -1 "$OUT/fake_driver_tests.log")")
fi
# The benchmarks time an unloaded host: after the suite, if it runs.
if [ -n "$suite_pid" ]; then
  wait "$suite_pid"
  summary+=("cpu suite: rc $? $(tail -1 "$OUT/cpu_suite.log")")
fi
if has bench; then
  JAX_PLATFORMS=cuda,cpu timeout "$LIMIT" $PY benchmarks/bench_tap.py \
      --steps 2000 --taps 100000 >"$OUT/gpu_bench.log" 2>&1
  summary+=("gpu bench: rc $?")
fi
if has dropins; then
  HOSTCB_GPU_ENGINE=1 JAX_PLATFORMS=cuda,cpu timeout "$LIMIT" $PY \
      benchmarks/bench_jax_callbacks.py --quick >"$OUT/gpu_dropins.log" 2>&1
  summary+=("gpu drop-ins bench: rc $?")
fi

for f in "$OUT"/gpu_tests.log "$OUT"/gpu_engine_tests.log \
    "$OUT"/fake_driver_tests.log "$OUT"/cpu_suite.log; do
  [ -f "$f" ] && { echo "== $f"; grep -E "^(FAILED|ERROR)|Error" "$f" | head -40; }
done
for f in "$OUT"/gpu_bench.log "$OUT"/gpu_dropins.log; do [ -f "$f" ] && cat "$f"; done
printf '%s\n' "${summary[@]}"
