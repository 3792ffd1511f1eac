# GovFlow: the single entry point for people and CI. Every target sets itself up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MO := locale/de/LC_MESSAGES/django.mo

.PHONY: run test bench chaos lint format clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

# The desk's German catalogue, compiled with gettext's msgfmt (the .mo is not committed).
$(MO): locale/de/LC_MESSAGES/django.po $(STAMP)
	$(PY) manage.py compilemessages -v 0 --locale de --ignore "$(VENV)" --ignore var

run: $(STAMP) $(MO)  ## migrate SQLite, create demo logins, start the web server and a worker
	$(PY) scripts/run.py

test: $(STAMP) $(MO)  ## the whole suite on SQLite and on PostgreSQL (started here if needed)
	$(PY) scripts/test_all.py $(ARGS)

bench: $(STAMP)  ## ledger, engine-vs-DBOS, external-task and desk benchmarks on one durable PostgreSQL server (ARGS=--quick: short)
	$(PY) bench/run.py $(ARGS)

chaos: $(STAMP)  ## the engine under SIGKILLs, a pause and a backend kill; every promise counted (ARGS="--n 300 --kills 4")
	$(PY) bench/chaos.py $(ARGS)

lint: $(STAMP) $(MO)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(PY) scripts/sizes.py
	$(PY) manage.py makemigrations --check --dry-run

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache .hypothesis .import_linter_cache
