# Two commands for a fresh machine: `make run` and `make test`.
# Each creates the virtualenv, installs the pinned requirements and migrates.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve

# The browser tests drive Debian's Chromium; install it when it is missing.
test: $(STAMP)
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) bench/run_all.py
