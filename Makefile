# contextgate: `make run` starts the gateway on 127.0.0.1:8080, `make test` runs every test
# (the Helm chart's tests included: helm is fetched, pinned, into .tools/ on first use; so
# are Claude Code and Codex, from npm, for the tests that run them through the gateway; and
# the browser tests' Chromium is Debian's, installed with apt-get on first use and noted in
# .tools/chromium).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080
HELM   := .tools/helm
CHROMIUM := .tools/chromium
CHART  := helm/contextgate
AGENTS := .tools/agents
CLAUDE := $(AGENTS)/node_modules/.bin/claude
CODEX  := $(AGENTS)/node_modules/.bin/codex

.PHONY: run test lint helm-lint fmt bench bench-peers fuzz-deep soak install install-dev agents clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# gateway/__init__.py: an editable install records whether gateway/ is a package.
$(VENV)/.installed: pyproject.toml constraints.txt gateway/__init__.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml constraints.txt gateway/__init__.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(VENV)/.installed $@

$(HELM): .ci/fetch-helm
	$(PYTHON) .ci/fetch-helm $@

# Debian's chromium for the browser tests (tests/ui), which Playwright drives: installed with
# apt-get when missing or older than .ci/fetch-chromium's pin, and its path noted here.
$(CHROMIUM): .ci/fetch-chromium
	$(PYTHON) .ci/fetch-chromium $@

# The coding agents the tests run through the gateway, at the versions .ci/agents pins
# (npm ci: the lock file's integrity hashes are checked). One npm ci makes both binaries
# (a grouped target, GNU make 4.3+). Each agent's native binary for this platform is an
# optional dependency, which npm skips silently when it cannot install it: `codex --version`
# checks Codex's came in (with a CODEX_HOME of its own, since it writes there even for that).
$(CLAUDE) $(CODEX) &: .ci/agents/package.json .ci/agents/package-lock.json
	mkdir -p $(AGENTS)
	cp .ci/agents/package.json .ci/agents/package-lock.json $(AGENTS)/
	cd $(AGENTS) && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(AGENTS)/codex-home
	CODEX_HOME=$(CURDIR)/$(AGENTS)/codex-home $(CODEX) --version
	touch -c $(CLAUDE) $(CODEX)

agents: $(CLAUDE) $(CODEX)

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# Byte-compiled first (quick when nothing changed), as an installed package is: where
# PYTHONDONTWRITEBYTECODE is set, every start would compile the sources again (0.5-1 s).
run: install
	$(BIN)/python -m compileall -q gateway pipelines
	$(BIN)/contextgate serve --host $(HOST) --port $(PORT)

# Byte-compiled first, as for `run`: the tests start dozens of Python processes (gateways,
# mock upstreams, the CLI), and with PYTHONDONTWRITEBYTECODE set each would compile the
# sources again.
test: install-dev $(HELM) $(CHROMIUM) $(CLAUDE) $(CODEX)
	$(BIN)/python -m compileall -q gateway pipelines bench tests
	$(BIN)/python -m pytest

# The reliability tests in their long form: a two-hour soak (SOAK_SECONDS) of two gateways
# at once (in-memory store; Redis with tracing), and the long overload and stream runs,
# which read CONTEXTGATE_RELIABILITY=long. The soak's RSS samples go to SOAK_CSV
# (bench/soak_plot.py draws them).
SOAK_SECONDS ?= 7200
SOAK_CSV ?= soak-rss.csv
soak: install-dev
	CONTEXTGATE_RELIABILITY=long CONTEXTGATE_SOAK_SECONDS=$(SOAK_SECONDS) \
		CONTEXTGATE_SOAK_CSV=$(SOAK_CSV) $(BIN)/python -m pytest -s tests/reliability

lint: install-dev helm-lint
	$(BIN)/ruff check gateway pipelines tests bench
	$(BIN)/ruff format --check gateway pipelines
	$(BIN)/mypy

helm-lint: $(HELM)
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --values $(CHART)/ci/full-values.yaml

fmt: install-dev
	$(BIN)/ruff format gateway pipelines tests bench
	$(BIN)/ruff check --fix gateway pipelines tests bench

# Hypothesis and schemathesis against a running gateway with many more examples than CI's.
fuzz-deep: install-dev
	CONTEXTGATE_FUZZ=deep $(BIN)/python -m pytest tests/reliability/test_fuzz.py \
		tests/reliability/test_corpus.py tests/reliability/test_schemathesis.py \
		--hypothesis-show-statistics

bench: install-dev
	$(BIN)/python -m bench.startup
	$(BIN)/python -m bench.footprint
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.small
	$(BIN)/python -m bench.overhead_responses
	$(BIN)/python -m bench.compaction
	$(BIN)/python -m bench.store
	$(BIN)/python -m bench.ledger
	$(BIN)/python -m bench.summaries
	$(BIN)/python -m bench.cache
	$(BIN)/python -m bench.replicas

# contextgate beside its peers (LiteLLM's proxy, Headroom), each installed at a pinned release
# in its own virtualenv under .bench/venvs on first use, all in front of the same mock.
bench-peers: install-dev
	$(BIN)/python -m bench.peer_envs
	$(BIN)/python -m bench.peers

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache
