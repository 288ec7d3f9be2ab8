# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
JAX_VERSION ?= 0.10.2
# PyTorch is only used by the DLPack tests of buffer_callback; 2.13.0 is
# the CPU build that this project's machines carry.
TORCH_VERSION ?= 2.13.0

.PHONY: demo test install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.deps-$(JAX_VERSION): | $(BIN)/python
	$(BIN)/pip install -q "jax==$(JAX_VERSION)" numpy "pytest>=8" pytest-timeout graphviz
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)" || echo "torch not installed: the PyTorch DLPack tests will say so"
	touch $@

# Always reinstall hostcb itself (not editable: the import hook ships as a
# .pth file that only a real install puts in site-packages).
install: $(VENV)/.deps-$(JAX_VERSION)
	$(BIN)/pip install -q --no-deps --no-build-isolation --force-reinstall .

demo: install
	$(BIN)/hostcb demo

# The whole suite on 4 CPU devices, then the multi-device tests on 2.
test: install
	HOSTCB_TEST_DEVICES=4 $(BIN)/python -m pytest -q -p no:cacheprovider tests
	HOSTCB_TEST_DEVICES=2 $(BIN)/python -m pytest -q -p no:cacheprovider -m multidevice tests

bench: install
	$(BIN)/python benchmarks/bench_tap.py

clean:
	rm -rf $(VENV) build src/*.egg-info
