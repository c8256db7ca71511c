# Everything starts from a fresh machine: `make test` and `make demo` create .venv themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO   := demo_out

.PHONY: setup test lint typecheck demo clean reliability docs

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt setup.py shardkit/codec/_jpeg_region.c shardkit/codec/_jpeg_restart.c shardkit/codec/_jpeg_errors.h \
		shardkit/transforms/_planar.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check shardkit tests pipelines benchmarks sample_data
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# tests/ and the doctests in shardkit/ (pyproject sets --doctest-modules)
test: setup lint typecheck
	$(BIN)/python -m pytest -q tests shardkit

# The documentation site (Sphinx + MyST, docs/); warnings are errors. Open docs/_build/html/index.html.
DOCS_STAMP := $(VENV)/.docs-stamp

docs: setup $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -b html docs docs/_build/html

$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

demo: setup
	rm -rf $(DEMO)
	$(BIN)/shardkit pack sample_data/imagefolder $(DEMO)/imagefolder --max-count 64 --seed 0
	$(BIN)/shardkit verify $(DEMO)/imagefolder --decode
	$(BIN)/shardkit info $(DEMO)/imagefolder
	$(BIN)/shardkit pack sample_data/coco/images --annotations sample_data/coco/instances.json $(DEMO)/coco --max-count 8
	$(BIN)/shardkit verify $(DEMO)/coco --decode
	$(BIN)/shardkit info $(DEMO)/coco
	@echo "--- streaming the packed sample side by side with torchvision ImageFolder and webdataset ---"
	$(BIN)/shardkit bench sample_data/imagefolder --shards $(DEMO)/imagefolder --workers 2 --batch-size 32 \
		--epochs 2 --repeats 3 --warmup 1 --size 128 --out $(DEMO)/bench.json --plot $(DEMO)/bench.png

# Not part of `make test`: seeded adversarial experiments (about four minutes on 2 cores), rewrites docs/concepts/reliability.md.
reliability: setup
	$(BIN)/python -m benchmarks.reliability --out docs/concepts/reliability.md

clean:
	rm -rf $(VENV) $(DEMO) .pytest_cache .ruff_cache .mypy_cache
