# Two commands matter: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/demo.yaml
PORT ?= 3000
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
INSTANCES := $(DAGSTER_HOME)

.PHONY: demo ablations test test-fast ui install clean

$(STAMP): pyproject.toml constraints.txt
	@echo "make: installing Refinery and its dependencies into $(VENV) (torch CPU, Dagster, Ray, polars; about 3 minutes on a fresh machine, once)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --progress-bar off -c constraints.txt -e ".[test]"
	@echo "make: installed; later runs skip this step until pyproject.toml or constraints.txt change"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/refinery demo --config $(CONFIG)

# The proxy-model ablations (docs/ablations.md) on a crawl of real text built from data/labelled,
# data/multilingual and the installed standard library, mpmath and sympy (code and math buckets):
# the graph, the data variants, schedule variants and anneal mixtures x three seeds, then the tables.
ablations: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/python data/ablations/build_crawl.py --out out/ablations-crawl
	$(BIN)/refinery demo --config configs/ablations.yaml
	$(BIN)/refinery ablations --config configs/ablations.yaml

# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on processes they
# start (Dagster runs, trainers, servers), and a file's module fixtures are built once.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --durations=20

test: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(PYTEST)

test-fast: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(PYTEST) -m "not slow"

# The UI serves the instance of CONFIG's data root only (orchestration/instance.py).
ui: override export DAGSTER_HOME = $(shell $(BIN)/python -m orchestration.instance $(CONFIG) $(INSTANCES))
ui: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	REFINERY_CONFIG=$(CONFIG) $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p $(PORT)

clean:
	rm -rf out .dagster_home
