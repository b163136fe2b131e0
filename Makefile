# contextgate: `make run` starts the gateway on 127.0.0.1:8080, `make test` runs every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: run test lint fmt bench install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

run: install
	$(BIN)/contextgate serve --host $(HOST) --port $(PORT)

test: install-dev
	$(BIN)/python -m pytest

lint: install-dev
	$(BIN)/ruff check gateway pipelines tests bench
	$(BIN)/ruff format --check gateway pipelines
	$(BIN)/mypy

fmt: install-dev
	$(BIN)/ruff format gateway pipelines tests bench
	$(BIN)/ruff check --fix gateway pipelines tests bench

bench: install-dev
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.compaction
	$(BIN)/python -m bench.store
	$(BIN)/python -m bench.summaries
	$(BIN)/python -m bench.cache
	$(BIN)/python -m bench.replicas

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
