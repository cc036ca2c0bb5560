# Conductor Web — two commands: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
HOST ?= 127.0.0.1

.PHONY: demo test lint format install install-dev install-local chromium migrate seed serve clean bench bench-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip wheel setuptools

# Re-install only when pyproject.toml changes. The local model's llama-cpp-python is installed
# separately (install-local): it compiles once into a wheelhouse that survives interruption.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-local: scripts/build_local_model.sh | $(VENV)/.installed
	bash scripts/build_local_model.sh

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev
install-local: $(VENV)/.installed-local

# Debian's Chromium for the browser tests; never a browser downloaded by a test tool.
chromium:
	@if [ -x /usr/bin/chromium ]; then echo "chromium: $$(/usr/bin/chromium --version 2>/dev/null)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium: could not install; browser tests will skip (or fail with CI=true)"; \
	else echo "chromium: missing and cannot install (not root); browser tests will skip (or fail with CI=true)"; fi

migrate: install
	$(BIN)/python manage.py migrate --noinput

seed: migrate
	$(BIN)/python manage.py seed_demo

# Sets everything up and starts daphne (plus a Celery worker when CELERY_BROKER_URL is set). On a
# fresh machine the local model builds in the background: every page works at once, and the local
# pool says "building" until it is ready.
demo: seed
	@[ -f $(VENV)/.installed-local ] || bash scripts/build_local_model.sh --background
	@bash scripts/demo.sh "$(HOST)" "$(PORT)"

test: install-dev install-local chromium
	@bash scripts/test.sh

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy apps conductor_web
	$(BIN)/lint-imports

format: install-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install-dev
	@echo "See bench/README.md: each benchmark is run by its own command."

# The LiteLLM proxy that bench/gateway.py measures side by side, in a venv of its own: never a
# runtime dependency of this project (the `bench` extra names the same requirement).
bench-venv:
	@[ -x .venv-bench/bin/litellm ] || { $(PYTHON) -m venv .venv-bench && .venv-bench/bin/pip install --quiet "$$(grep -o '"litellm\[proxy\][^"]*"' pyproject.toml | tr -d '"')"; }

clean:
	rm -rf $(VENV) var/*.sqlite3* var/staticfiles
