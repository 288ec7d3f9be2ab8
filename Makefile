# The two commands of the README: `make demo` and `make test` (and `make
# lint`, which CI runs first).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
JAX_VERSION ?= 0.10.2
# The differential harness's oracle (tests/test_legacy_diff.py): legacy JAX,
# the last release with jax.experimental.host_callback, in its own venv.
LEGACY_PYTHON ?= python3.11
LEGACY := .venv-legacy
# PyTorch is only used by the DLPack tests of buffer_callback; 2.13.0 is
# the CPU build that this project's machines carry.
TORCH_VERSION ?= 2.13.0

# ruff, the linter and formatter (configured in pyproject.toml), and
# clang-format for the C++ (.clang-format), both pinned: a newer release may
# format differently.
RUFF_VERSION ?= 0.17.6
CLANG_FORMAT_VERSION ?= 21.1.8
CXX_SOURCES = $(wildcard src/hostcb/_native/*.cc src/hostcb/_native/*.h \
  tests/native/*.cc tests/native/*.h)

.PHONY: demo test lint install bench check-oldest check-newest wheels \
  check-wheels check-wheel clean .venv-legacy docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.deps-$(JAX_VERSION): | $(BIN)/python
	$(BIN)/pip install -q "jax==$(JAX_VERSION)" numpy "pytest>=8" pytest-timeout graphviz hypothesis "setuptools>=77" wheel tqdm tensorboard "sybil>=9"
	$(BIN)/pip install -q wandb || echo "wandb not installed: the W&B sink's test of hostcb.metrics will say so"
	$(BIN)/pip install -q "torch==$(TORCH_VERSION)" || echo "torch not installed: the PyTorch DLPack tests will say so"
	touch $@

# jax.export's serialization of programs with host functions by name
# (tests/test_export.py, docs/export.md): hostcb's `export` extra.  Its own
# stamp, so that a .venv made before it gets it too.
$(VENV)/.deps-export: | $(BIN)/python
	$(BIN)/pip install -q "flatbuffers>=24"
	touch $@

# Legacy JAX 0.4.30 needs Python 3.11 (or older) and numpy<2.  Where it cannot
# be made (no $(LEGACY_PYTHON), no network) the harness tests skip and say
# what is missing; `make test` does not fail for it.
$(LEGACY)/.deps:
	@if command -v $(LEGACY_PYTHON) >/dev/null 2>&1; then \
	  ( $(LEGACY_PYTHON) -m venv $(LEGACY) \
	    && $(LEGACY)/bin/pip install -q "jax==0.4.30" "jaxlib==0.4.30" "numpy<2" \
	    && touch $@ ) \
	  || echo "could not install legacy JAX in $(LEGACY): the legacy differential tests will skip"; \
	else \
	  echo "no $(LEGACY_PYTHON) on this machine: the legacy differential tests will skip"; \
	fi

.venv-legacy: $(LEGACY)/.deps

$(VENV)/.ruff-$(RUFF_VERSION): | $(BIN)/python
	$(BIN)/python -m pip install -q "ruff==$(RUFF_VERSION)"
	touch $@

$(VENV)/.clang-format-$(CLANG_FORMAT_VERSION): | $(BIN)/python
	$(BIN)/python -m pip install -q "clang-format==$(CLANG_FORMAT_VERSION)"
	touch $@

# The lint and the formatters' check: ruff (pyproject.toml's [tool.ruff])
# over the whole tree, clang-format over the C++.
lint: $(VENV)/.ruff-$(RUFF_VERSION) $(VENV)/.clang-format-$(CLANG_FORMAT_VERSION)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/clang-format --dry-run --Werror $(CXX_SOURCES)

# Always reinstall hostcb itself (not editable: the import hook ships as a
# .pth file that only a real install puts in site-packages).  The test build
# of the native engine (setup.py's HOSTCB_TEST_BUILD=1: with the simulated
# CUDA driver and the fault injections of tests/native that the tests
# drive); the wheels (`make wheels`) and a plain `pip install .` make the
# production build, which has none of them.
install: $(VENV)/.deps-$(JAX_VERSION) $(VENV)/.deps-export
	HOSTCB_TEST_BUILD=1 $(BIN)/pip install -q --no-deps --no-build-isolation \
	  --force-reinstall .

demo: install
	$(BIN)/hostcb demo

# The whole suite on 4 CPU devices, then the multi-device tests on 2.  The
# native engine must have been built by `install` (HOSTCB_REQUIRE_NATIVE).
test: install $(LEGACY)/.deps
	HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=4 $(BIN)/python -m pytest -q -p no:cacheprovider tests
	HOSTCB_TEST_DEVICES=2 $(BIN)/python -m pytest -q -p no:cacheprovider -m multidevice tests

# The docs site (mkdocs.yml): its tools are pyproject.toml's `docs` extra,
# pinned; mkdocstrings reads the docstrings from src/ without importing
# hostcb, so nothing needs building.  --strict: a broken link or anchor,
# a page outside the nav or a docstring it cannot parse fails the build.
# NO_MKDOCS_2_WARNING silences mkdocs-material's banner about its end of life.
DOCS_SITE ?= site
$(VENV)/.deps-docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))" > $(VENV)/docs-requirements.txt
	$(BIN)/pip install -q -r $(VENV)/docs-requirements.txt
	touch $@

docs: $(VENV)/.deps-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d $(DOCS_SITE)

bench: install
	$(BIN)/python benchmarks/bench_tap.py

# The suite against the oldest JAX that pyproject.toml admits (CI runs it).
check-oldest:
	bash scripts/check_oldest_jax.sh

# The suite against the newest JAX that pip resolves, on a Python >= 3.12
# (found, or built once from Debian's source into ~/.cache/hostcb; CI runs it).
check-newest:
	bash scripts/check_newest_jax.sh

# The release's files in dist/: the sdist, and from it one manylinux wheel
# per CPython 3.11, 3.12, 3.13 (3.14 where found), each repaired by
# auditwheel and tagged as `auditwheel show` reports.  Without a container
# runtime it uses this machine's interpreters (pyenv); a real CI uses
# cibuildwheel (.github/workflows/wheels.yml).
# The time budgets (seconds): each half took 5-8 minutes on 2 busy cores
# with warm pip caches (277 s to build, 490 s to check).
WHEELS_BUDGET_S ?= 1200
CHECK_WHEELS_BUDGET_S ?= 1200
wheels:
	timeout $(WHEELS_BUDGET_S) bash scripts/build_wheels.sh

# What users install (CI runs it): each wheel of `make wheels` in fresh
# environments with no compiler reachable, under the oldest and the newest
# JAX of its Python; the repository by a plain `pip install` and the sdist
# by `uv pip install` (build isolation).  Each must tap and call through
# the native engine.
check-wheels: wheels
	timeout $(CHECK_WHEELS_BUDGET_S) bash scripts/check_wheels.sh

# The former name of check-wheels (one cp311 wheel then).
check-wheel: check-wheels

clean:
	rm -rf $(VENV) $(LEGACY) .venv-oldest .venv-newest .venv-wheel .venv-wheels dist site \
	  build src/*.egg-info \
	  src/hostcb/_native/*.so src/hostcb/_native/_build_failure.txt
