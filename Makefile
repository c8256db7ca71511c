# Everything starts from a fresh machine: `make test` and `make demo` create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   := demo_out

# Imports write their bytecode: uv installs none (below), and an environment that forbids writing
# it would recompile torch in every process the tests start (seconds each).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup test check lint typecheck pytest demo clean reliability docs wheel

setup: $(STAMP)

# uv installs the ~7 GB test environment (torch, CUDA libraries, DALI, Ray) in about a third of
# pip's time: it downloads and unpacks in parallel and compiles no bytecode up front. pip only
# bootstraps it, and where uv cannot be had the same install runs with pip. uv does not read
# pip's configuration, so the indexes and find-links pip is configured with (a mirror, a wheel
# folder) are handed to it, merged as pip merges them.
UV_FROM_PIP = $(foreach key,index-url extra-index-url find-links,$(foreach url,$(shell $(PYTHON) -m pip config get global.$(key) 2>/dev/null),--$(key) $(url)))
INSTALL = -c constraints.txt -e '.[test]'

$(STAMP): pyproject.toml constraints.txt setup.py shardkit/codec/_jpeg_region.c shardkit/codec/_jpeg_restart.c shardkit/codec/_jpeg_errors.h \
		shardkit/transforms/_planar.c shardkit/format/_tarspan.c shardkit/codec/_jpeg_header.c \
		shardkit/transforms/_draws.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	if $(BIN)/python -m pip install -q 'uv>=0.5'; then \
		$(BIN)/uv pip install -q --python $(BIN)/python --index-strategy unsafe-best-match $(UV_FROM_PIP) $(INSTALL); \
	else \
		$(BIN)/python -m pip install -q $(INSTALL); \
	fi
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check shardkit tests pipelines benchmarks sample_data
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# tests/ and the doctests in shardkit/ (pyproject sets --doctest-modules), on every core
# (pytest-xdist; a test file stays on one worker, so module fixtures such as a Ray cluster start once).
# One worker more than the cores: many tests wait on the processes they start (ranks, Ray nodes, a
# pty), which left cores idle; on 2 cores the suite took 473 s with 3 workers against 536-556 s with 2.
# --no-loadscope-reorder: files go out in collection order, longest first (tests/conftest.py's
# FIRST_FILES), instead of by their count of tests, which started the long files with few tests
# last: on the 2-core box (2026-12-06) the suite took 325 and 330 s against 397 and 426 s.
XDIST  := $(shell $(PYTHON) -c "import os; print(len(os.sched_getaffinity(0)) + 1 if hasattr(os, 'sched_getaffinity') else (os.cpu_count() or 1) + 1)")
PYTEST := $(BIN)/python -m pytest -q -n $(XDIST) --dist loadfile --no-loadscope-reorder

test: setup lint typecheck pytest

pytest: setup
	$(PYTEST) tests shardkit

# The inner loop: lint, types and the tests not marked slow (tests/conftest.py marks them).
check: setup lint typecheck
	$(PYTEST) -m "not slow" tests shardkit

# A wheel and an sdist in dist/ (the wheel carries the C extensions built here).
wheel: setup
	rm -rf dist
	$(BIN)/python -m build --installer uv --outdir dist .

# The documentation site (Sphinx + MyST, docs/); warnings are errors. Open docs/_build/html/index.html.
DOCS_STAMP := $(VENV)/.docs-stamp

docs: setup $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

demo: setup
	rm -rf $(DEMO)
	$(BIN)/shardkit pack sample_data/imagefolder $(DEMO)/imagefolder --max-count 64 --seed 0 --uniform-names
	$(BIN)/shardkit verify $(DEMO)/imagefolder --decode
	$(BIN)/shardkit info $(DEMO)/imagefolder
	$(BIN)/shardkit pack sample_data/coco/images --annotations sample_data/coco/instances.json $(DEMO)/coco --max-count 8
	$(BIN)/shardkit verify $(DEMO)/coco --decode
	$(BIN)/shardkit info $(DEMO)/coco
	@echo "--- streaming the packed sample side by side with torchvision ImageFolder and webdataset ---"
	@# 30 epochs of the 300 images: the fastest loader's timed runs last about 2 s on 2 cores, long enough for a steady ratio
	$(BIN)/shardkit bench sample_data/imagefolder --shards $(DEMO)/imagefolder --workers 2 --batch-size 32 \
		--epochs 30 --repeats 3 --warmup 1 --size 128 --out $(DEMO)/bench.json --plot $(DEMO)/bench.png

# Not part of `make test`: seeded adversarial experiments (about four minutes on 2 cores), rewrites docs/concepts/reliability.md.
reliability: setup
	$(BIN)/python -m benchmarks.reliability --out docs/concepts/reliability.md

clean:
	rm -rf $(VENV) $(DEMO) dist .pytest_cache .ruff_cache .mypy_cache
