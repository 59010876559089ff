# Two commands on a fresh machine: `make crash-matrix` and `make test`.
# Each bootstraps .venv on its own; nothing but Python needs to be installed first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: test lint typecheck unit diagrams crash-matrix bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests experiments examples

typecheck: $(STAMP)
	$(BIN)/mypy --strict src

test: lint typecheck
	$(BIN)/python -m pytest

diagrams: $(STAMP)
	$(BIN)/effectlog diagram step --format mermaid > docs/diagrams/step.mmd
	$(BIN)/effectlog diagram run --format mermaid > docs/diagrams/run.mmd

clean:
	rm -rf $(VENV) work .pytest_cache .mypy_cache .ruff_cache
