# kubeinfer: `make demo` and `make test` work on a fresh machine; each sets itself up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench crds clean

# The virtual environment is rebuilt only when the dependencies change.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip "setuptools>=75"
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/python -m kubeinfer.operator demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check operator runtime tests examples
	$(BIN)/lint-imports

crds: $(STAMP)
	$(BIN)/kubeinfer crds --write

clean:
	rm -rf $(VENV) .bench .demo build *.egg-info
