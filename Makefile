# Two commands for a fresh machine: `make run` and `make test`.
# Each creates the virtualenv and installs the pinned requirements: `make run`
# only what Hermes needs (requirements.txt), `make test` also the test, lint and
# type-checking tools (requirements-dev.txt). A stamp per file set records what
# is installed; editing a requirements file re-installs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev

.PHONY: run test test-quick soak lint bench screenshots chromium check-upstream

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(RUNTIME): requirements.txt | $(PY)
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# The dev set includes the runtime one (`-r requirements.txt`).
$(DEV): requirements.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@ $(RUNTIME)

# `PORT=8080 make run` serves on another port; BIND=0.0.0.0 beyond this machine
# (not HOST: some shells set that to the machine's name).
PORT ?= 8000
BIND ?= 127.0.0.1

# collectstatic writes the gzip and Brotli copies that WhiteNoise serves
# (hermes_site/static_files.py); without it the sources are served as they are.
run: $(RUNTIME)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py serve --host $(BIND) --port $(PORT)

# The browser tests drive Debian's Chromium; install it when it is missing.
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

# The suite runs in TEST_JOBS processes (pytest-xdist); each has its own
# database, ports, channel-layer keys, fake model server and Chromium.
TEST_JOBS ?= 3
XDIST = -n $(TEST_JOBS)

test: $(DEV) chromium
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: no browser, no real processes or outages, no fuzzing.
test-quick: $(DEV)
	$(PY) -m pytest $(XDIST) -m "not browser and not chaos and not schemathesis and not slow" $(PYTEST_ARGS)

# The whole suite five times beside a busy core; a table of each run.
soak: $(DEV) chromium
	$(PY) -m hermes_testing.soak --runs $(or $(RUNS),5)

# Lint, format and type checks, all at zero findings (CI runs this first).
lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy .

# Refresh the README's pictures in docs/screenshots/ (`make test` writes its
# pictures under var/ and leaves the tree as it was).
screenshots: $(DEV)
	HERMES_SCREENSHOTS_DIR=docs/screenshots $(PY) -m pytest -q \
	  "chat/tests/browser/test_appearance.py::test_screenshots" \
	  "chat/tests/browser/test_branches.py::test_three_versions_of_an_answer_screenshot" \
	  "chat/tests/browser/test_attachments.py" \
	  "chat/tests/browser/test_sidebar.py::test_chats_are_grouped_by_date" \
	  "chat/tests/browser/test_queue_steer.py::test_type_while_streaming_see_it_pending_then_land" \
	  "chat/tests/browser/test_search.py" "chat/tests/browser/test_titles.py" \
	  "chat/tests/browser/test_transfer.py::test_export_a_chat_as_markdown_and_json" \
	  "chat/tests/browser/test_composer.py::test_keyboard_shortcuts_new_chat_stop_focus_and_help"

bench: $(RUNTIME)
	$(PY) bench/run_all.py

# What an OpenAI-compatible server does in the cases Hermes depends on
# (docs/providers.md): `make check-upstream URL=http://127.0.0.1:8080/v1`,
# with ARGS="--model NAME --api-key-env VAR --format markdown" as needed.
check-upstream: $(RUNTIME)
	@test -n "$(URL)" || (echo "usage: make check-upstream URL=http://host:port/v1" && false)
	$(PY) manage.py check_upstream $(URL) $(ARGS)
