# Two commands set up everything on a fresh machine:
#   make demo   runs examples/order_intake.py on the embedded SQLite store
#   make test   runs the whole test suite (starts a throwaway PostgreSQL 15 server)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

.PHONY: install demo test typecheck bench clean
install: $(VENV)/.installed

demo: install
	rm -f runifold-workflows.db runifold-workflows.db-wal runifold-workflows.db-shm
	$(BIN)/python examples/order_intake.py

test: install
	$(BIN)/python -m mypy
	bash scripts/with-postgres.sh $(BIN)/python -m pytest -q $(PYTEST_ARGS)

typecheck: install
	$(BIN)/python -m mypy

bench: install
	bash scripts/with-postgres.sh $(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache *.db *.db-wal *.db-shm
