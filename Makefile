# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
# Lint what exists: git keeps no empty directories, so bench/ may be missing from a clone.
LINT    = $(wildcard daemon tests bench)

.PHONY: demo test lint typecheck check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)   ## run the daemon on an embedded PostgreSQL with config.example.toml
	@$(BIN)/pgtick demo --config config.example.toml

test: $(STAMP)   ## lint, type-check and run the whole test suite
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
