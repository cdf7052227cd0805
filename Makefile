# Two commands matter: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/demo.yaml
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test test-fast ui install clean

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

test: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	$(BIN)/python -m pytest -q -ra -m "not slow"

ui: $(STAMP)
	mkdir -p $(DAGSTER_HOME)
	REFINERY_CONFIG=$(CONFIG) $(BIN)/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000

clean:
	rm -rf out .dagster_home
