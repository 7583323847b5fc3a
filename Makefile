# Switchyard — the two commands are `make run` and `make test`; everything else is a helper.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
# libibverbs + libnl: the Mooncake Transfer Engine loads them even for TCP transfers. PostgreSQL
# and redis-server: each test run starts its own (tests/support/services.py); none need be running.
APT_PACKAGES := postgresql redis-server libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200 chromium prometheus
FRONTEND_STAMP := frontend/node_modules/.installed
FRONTEND_SOURCES := $(shell find frontend/src -type f) frontend/index.html frontend/vite.config.ts

.PHONY: setup frontend run test lint format check unit bench-engine bench-gateway demo-model demo-draft gpu-check clean

setup: $(STAMP) apt frontend

# The admin console: npm packages from package-lock.json, built into frontend/dist (served at /).
frontend: frontend/dist/index.html

$(FRONTEND_STAMP): frontend/package.json frontend/package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js >= 20.19 (https://nodejs.org)"; exit 1; }
	@node -e 'const [a,b]=process.versions.node.split(".").map(Number); if (a<20||(a===20&&b<19)) { console.error("Node.js >= 20.19 is needed, found "+process.version); process.exit(1) }'
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

frontend/dist/index.html: $(FRONTEND_STAMP) $(FRONTEND_SOURCES)
	cd frontend && npm run build --silent

# Debian packages, only those missing (root, or passwordless sudo).
apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ $$(id -u) -eq 0 ] && echo "" || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

$(STAMP): requirements.txt
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: asking for it through another package could pull a CUDA build.
	# --no-compile, then compileall on every core: pip compiles on one as it installs (73 s of
	# installing here, 42 s this way). A few files are not Python 3.11 (torch's py312_intrinsics):
	# pip skips them silently, and so does -qq, whose exit status says only that they exist.
	$(PIP) install -q --no-compile torch==2.13.0
	$(PIP) install -q --no-compile -r requirements.txt
	$(PY) -m compileall -qq -j 0 $(VENV)/lib > /dev/null || true
	@touch $(STAMP)

# `make run MODEL=/path/to/hf-dir [NAME=name]` serves that model directory instead of the demo.
run: setup
	$(PY) -m scripts.run $(if $(MODEL),--model "$(MODEL)") $(if $(NAME),--name "$(NAME)")

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Neither check needs a database (models against migration files), so they get a throwaway one:
# pointed at TEST_DATABASE_URL, makemigrations warned that its database did not exist (pytest
# creates test_<name>, never <name> itself).
check: setup
	DATABASE_URL=sqlite://:memory: $(PY) manage.py check
	DATABASE_URL=sqlite://:memory: $(PY) manage.py makemigrations --check --dry-run

# Every pytest run starts its own PostgreSQL and Redis on free ports (make run defaults to
# SQLite); TEST_DATABASE_URL / TEST_REDIS_URL, given here or in the environment, use yours instead.
# TEST_WORKERS pytest workers (pytest-xdist), each with its own PostgreSQL and Redis; a module's
# tests stay on one worker (a stack it starts is started once), the long modules first.
TEST_WORKERS ?= 2
WORKERS := $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
test: setup lint check
	cd frontend && npm test --silent
	$(PY) -m pytest $(WORKERS) --durations=40 $(PYTEST_ARGS)

# The fast lane: no test that starts processes, none that computes for seconds (tests/support/lanes.py).
unit: $(STAMP) apt
	$(PY) -m pytest $(WORKERS) -m "not processes and not slow" $(PYTEST_ARGS)

bench-engine: setup
	$(PY) -m workers.bench engine

bench-gateway: setup
	$(PY) -m workers.bench gateway

# Retrain the committed demo model (workers/demo/model) from its seeded corpus.
demo-model: setup
	$(PY) -m workers.demo.train

# Retrain the demo model's committed EAGLE-3 draft head (workers/demo/draft) on its own answers.
demo-draft: setup
	$(PY) -m workers.demo.draft_prompts --out .cache/demo-draft-prompts.jsonl
	$(PY) -m workers.draft_training.train_eagle3 --target workers/demo/model --data .cache/demo-draft-prompts.jsonl \
		--out workers/demo/draft

gpu-check: setup
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .switchyard frontend/node_modules frontend/dist
