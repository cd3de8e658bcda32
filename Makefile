# FlexInfer — the two commands a new user needs are `make run` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo $(CURDIR)/.tools/bin/uv)
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
EXAMPLE ?= examples/homelab.yaml
PYTEST_ARGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(CURDIR)/.tools/bin/uv:
	$(PYTHON) -m venv $(CURDIR)/.tools
	$(CURDIR)/.tools/bin/pip install --quiet --disable-pip-version-check uv

.PHONY: install
install: $(if $(findstring .tools,$(UV)),$(UV)) ## Create .venv with every package from the lock file (needs only Python 3.11+)
	$(UV) sync --locked --python $(PYTHON)

# The demo shortens the demand window (the seed's default is 2m) so a swap back happens within 20 s of the last
# request; override with `make run FLEXINFER_SHARED_DEMAND_WINDOW=2m`.
FLEXINFER_SHARED_DEMAND_WINDOW ?= 20s
FLEXINFER_DEMAND_REFRESH_INTERVAL ?= 5s

.PHONY: run
run: install ## Run the whole system on this machine with two fake models sharing one GPU group
	FLEXINFER_SHARED_DEMAND_WINDOW=$(FLEXINFER_SHARED_DEMAND_WINDOW) \
	FLEXINFER_DEMAND_REFRESH_INTERVAL=$(FLEXINFER_DEMAND_REFRESH_INTERVAL) \
	$(BIN)/flexinfer up -f $(EXAMPLE)

.PHONY: test
# TEST_JOBS=N runs the suite on N pytest-xdist workers, a whole test module each at a time (module fixtures stay in
# one process). The default is one process: on a 2-core machine two workers took 13 min instead of 20, but the chaos
# suite or an actuator timing test then failed under the load (four of five parallel runs had a failure; two of
# those were test races, since fixed).
TEST_JOBS ?= 0
test: install ## Run every test (unit, integration with real NATS and Postgres, end to end); TEST_JOBS=N: on N workers
	$(BIN)/pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

.PHONY: real-servers
real-servers: ## Build or find the real inference servers the e2e suite uses (llama.cpp; cached in ~/.cache/flexinfer)
	$(PYTHON) scripts/install_real_servers.py

.PHONY: test-unit
test-unit: install ## Only the tests that start nothing (no NATS, PostgreSQL or Kubernetes emulator)
	$(BIN)/pytest tests/unit -m "not (integration or emulator or e2e or chaos)" $(PYTEST_ARGS)

.PHONY: test-chaos
test-chaos: install ## The full chaos suite: 1,000 requests while every service, NATS and Postgres are SIGKILLed
	FLEXINFER_CHAOS_FULL=1 $(BIN)/pytest -s tests/chaos $(PYTEST_ARGS)

.PHONY: verify
verify: install ## Lint, format check, strict types, import contracts, migrations in sync with the models, generated docs up to date
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_migrations.py
	$(BIN)/python scripts/gen_events_doc.py --check
	$(BIN)/python scripts/gen_reference_doc.py --check
	$(BIN)/python scripts/gen_chart_schemas.py --check

.PHONY: chart-lint
chart-lint: install ## Lint and render the Helm charts; validate them, the CRDs, the Dockerfile, docker-compose.yml and the monitoring files offline
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_charts.py tests/unit/test_metrics.py

.PHONY: docs
docs: install ## Regenerate docs/events.md, the tables of docs/reference.md (settings, metrics, CLI) and charts/*/values.schema.json
	$(BIN)/python scripts/gen_events_doc.py
	$(BIN)/python scripts/gen_reference_doc.py
	$(BIN)/python scripts/gen_chart_schemas.py

.PHONY: charts
charts: install ## Resolve the charts' file:// dependencies (the library chart; the umbrella's subcharts) for helm install/lint
	$(BIN)/python -c 'import helm_python as h; [h.dependency_update(f"charts/{c}") for c in ("proxy", "scheduler", "actuator", "lease-manager", "flexinfer")]'

.PHONY: bench
bench: install ## Benchmarks (print ratios measured side by side)
	@for b in bench/[!_]*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

.PHONY: clean
clean: ## Remove the local state of `flexinfer up` (.flexinfer) and caches
	rm -rf .flexinfer .pytest_cache .mypy_cache .ruff_cache
