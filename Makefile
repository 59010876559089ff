# Two commands on a fresh machine: `make crash-matrix` and `make test`.
# Each bootstraps .venv on its own; nothing but Python needs to be installed first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: test lint typecheck unit diagrams crash-matrix bench clean venv console-screenshots

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests experiments examples
	$(BIN)/ruff format --check src tests experiments examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

# Every test, the crash matrix and the soak included; PostgreSQL, Chromium and faketime are installed
# if missing and started by the tests themselves on 127.0.0.1.
test: lint typecheck
	@bash .ci/ensure-postgres
	@bash .ci/ensure-chromium
	@bash .ci/ensure-faketime
	$(BIN)/python -m pytest

# The main job: kill real workers at every boundary, on every journal backend, count
# effects in the independent effect store, verify the report from its evidence, print the table.
crash-matrix: $(STAMP)
	@bash .ci/ensure-postgres
	@mkdir -p work
	$(BIN)/effectlog crash-matrix run --backend sqlite --backend postgres --output work/crash-matrix.json
	$(BIN)/effectlog crash-matrix verify work/crash-matrix.json > /dev/null
	@echo "verified: work/crash-matrix.json"

# Screenshots of every console page (docs/img/console-*.png) in headless Chromium; commit and look at them.
console-screenshots: $(STAMP)
	@bash .ci/ensure-chromium
	$(BIN)/python experiments/console_screenshots.py

diagrams: $(STAMP)
	$(BIN)/effectlog diagram step --format mermaid > docs/diagrams/step.mmd
	$(BIN)/effectlog diagram run --format mermaid > docs/diagrams/run.mmd
	$(BIN)/effectlog diagram attempt --format mermaid > docs/diagrams/attempt.mmd

# Side by side in one invocation: bench.py (the SQLite floor, effectlog, DBOS, LangGraph; wall and
# CPU time), then experiments/resume_bench.py and experiments/fleet_bench.py when present (the
# fleet's on SQLite and a throwaway PostgreSQL), then docs/performance.md and docs/img/bench-*
# from all their results (experiments/results/*.json). `make bench QUICK=1` for a short run.
bench: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@bash .ci/ensure-postgres
	$(BIN)/python experiments/bench.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) work .pytest_cache .mypy_cache .ruff_cache
