# `make demo` and `make test` each create .venv when it is missing, install
# what they need, and run. `make test` first runs `make services`, which
# installs and starts PostgreSQL, Redis, NATS and Apache Kafka on loopback
# when they are not answering (ci/services.sh). Nothing else needs to be set
# up by hand. Where the services cannot be started (no root, no apt-get),
# `make test` says so and their tests skip, except with CI=true, where a
# missing service fails the run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test check services lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m wakuwaku demo flights --chaos --replay-dead-letters

services:
	bash ci/services.sh

# Four xdist workers by default on the 2-core machines CI runs on: most tests
# wait on a server, so two workers per core keep both cores busy. A test
# that hangs is stopped by its timeout and its worker replaced, and the run
# goes on. Figures in docs/services.md, "Running the tests".
WORKERS ?= 4

test: $(STAMP)
	@bash ci/services.sh || { [ "$${CI:-}" != true ] && echo "services: not all are up; their tests skip here (with CI=true they fail)"; }
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -n $(WORKERS) --cov --cov-report=term

# The quick loop: lint, then every test that needs no server, no browser and
# no subprocess run (markers redis, nats, kafka, iggy, postgres, browser,
# slow), on every core. `make test` runs all of it, in CI too.
QUICK := not (slow or redis or nats or kafka or iggy or postgres or browser)
check: $(STAMP)
	$(MAKE) --no-print-directory lint
	$(PY) -m pytest -n auto -q -m "$(QUICK)"

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples conftest.py
	$(PY) -m ruff format --check src tests benchmarks examples conftest.py
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The benchmarks' peer baselines (FastStream) come with the bench extra.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,demo,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
