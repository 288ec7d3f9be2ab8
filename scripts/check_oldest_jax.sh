#!/usr/bin/env bash
# Runs the test suite against the oldest JAX that pyproject.toml admits
# (jax>=0.8: 0.8.0), in its own virtual environment .venv-oldest.
#   bash scripts/check_oldest_jax.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
JAX_OLDEST=${JAX_OLDEST:-0.8.0}
VENV=.venv-oldest
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# setuptools and wheel: hostcb is built without build isolation, against
# this venv's jaxlib headers (the native engine): the jaxlib that
# pyproject.toml's isolated build pins too.  setuptools>=77 as there (the
# SPDX license string).
"$VENV/bin/pip" install -q "jax==$JAX_OLDEST" "jaxlib==$JAX_OLDEST" numpy \
  "pytest>=8" pytest-timeout hypothesis "setuptools>=77" wheel tqdm \
  flatbuffers
# The test build of the native engine, as `make install` makes it (the
# simulated CUDA driver and the fault injections that the suite drives).
HOSTCB_TEST_BUILD=1 "$VENV/bin/pip" install -q --no-deps --no-build-isolation \
  --force-reinstall .
"$VENV/bin/python" -c "import jax; print('jax', jax.__version__)"
"$VENV/bin/python" -c "from hostcb import _engine as engine; print('native engine:', engine.available() or engine.unavailable_reason())"
HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=4 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
