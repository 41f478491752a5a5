# The two commands of the README:  make run  (install + start)  and  make test  (install + full suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
# Debian packages: mysqlclient's build deps, redis-server (tests start private ones), Chromium for
# the browser tests.
SYSTEM_PACKAGES := pkg-config libmariadb-dev gcc python3-dev redis-server chromium chromium-driver
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: setup system-deps venv run web test test-mysql contract lint format check-deploy deploy-lint \
	image-test clean

setup: system-deps venv

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "Installing system packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.installed: requirements.txt requirements-dev.txt | $(BIN)/python
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

venv: $(VENV)/.installed

run: setup
	$(PY) manage.py migrate --noinput
	$(PY) manage.py bootstrap_admin
	@echo "Dashboard/API: http://$(HOST):$(PORT)/  (admin: http://$(HOST):$(PORT)/admin/, API docs: /api/docs/)"
	$(PY) manage.py runcluster --host $(HOST) --port $(PORT)

test: setup
	$(BIN)/pytest

# The same suite against MariaDB/MySQL (a database of its own: test_sched_local).
test-mysql: setup
	DATABASE_URL=$${DATABASE_URL:-mysql://root@127.0.0.1:3306/sched_local} $(BIN)/pytest

# The API contract: schemathesis against a live server, as an admin and as a viewer.
contract: setup
	tests/contract/run.sh

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

check-deploy: venv
	DJANGO_SETTINGS_MODULE=scheduler_project.settings_production \
	DJANGO_SECRET_KEY=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))') \
	DJANGO_ALLOWED_HOSTS=scheduler.example.com \
	$(PY) manage.py check --deploy --fail-level WARNING

# The deploy files, offline: the Dockerfile (hadolint), the compose file against the compose spec's
# schema as written and as resolved (anchors, merges, variables: podman-compose config), the
# Kubernetes manifests against Kubernetes' own schemas (kubernetes-validate, strict).
deploy-lint: venv
	$(BIN)/hadolint --config docker/hadolint.yaml docker/Dockerfile
	$(BIN)/check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml
	set -o pipefail; DJANGO_SECRET_KEY=lint-only \
	  $(BIN)/podman-compose --dry-run -f docker/compose.yaml config \
	  | $(BIN)/check-jsonschema --builtin-schema vendor.compose-spec --default-filetype yaml -
	$(BIN)/kubernetes-validate --strict --quiet docker/k8s/*.yaml

# Build the image with podman on a local Debian bookworm base and run it against the local MariaDB
# and Redis (installs podman & co. with apt when missing). See docker/image-test.sh.
image-test:
	docker/image-test.sh

clean:
	rm -rf $(VENV) staticfiles .pytest_cache .ruff_cache
