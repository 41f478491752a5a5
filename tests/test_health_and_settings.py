"""Health probes, and production settings that are deploy-clean and refuse insecure values
(docs/operations.md, docs/security.md).

The production settings are imported in a subprocess, with the environment passed explicitly:
they raise at import time, and they must not leak into this test process.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

import pytest
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from scheduler_project import health

BASE_DIR = django_settings.BASE_DIR
PRODUCTION = "scheduler_project.settings_production"
CHECK_TIMEOUT_S = 60
# Variables a case sets itself; inherited values would make the cases depend on the shell.
CONTROLLED = ("DJANGO_SECRET_KEY", "DJANGO_DEBUG", "DJANGO_ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")


# --- health --------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_live_is_public_and_ok():
    response = APIClient().get("/health/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]


@pytest.mark.django_db
def test_ready_checks_the_database(settings):
    settings.REDIS_URL = ""
    settings.REDLOCK_URLS = []
    response = APIClient().get("/health/ready")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"] == "ok"
    assert float(body["checks"]["database_ms"]) >= 0
    assert "redis" not in body["checks"]


@pytest.mark.django_db
def test_ready_is_503_when_the_database_is_down(settings, monkeypatch):
    settings.REDIS_URL = ""
    settings.REDLOCK_URLS = []

    def broken() -> str:
        raise ConnectionError("database went away")

    monkeypatch.setattr(health, "_check_database", broken)
    response = APIClient().get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "error: ConnectionError"
    assert "went away" not in json.dumps(body)  # no internals leak to an anonymous caller


@pytest.mark.django_db
def test_ready_is_503_when_redis_is_unreachable(settings):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
    response = APIClient().get("/health/ready")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"] == "ok"
    assert checks["redis"].startswith("error: ")


@pytest.mark.django_db
def test_ready_reports_redis_ok(settings, redis_url):
    settings.REDIS_URL = redis_url
    response = APIClient().get("/health/ready")
    assert response.status_code == 200
    assert response.json()["checks"]["redis"] == "ok"


@pytest.mark.django_db
def test_ready_follows_the_redlock_quorum(settings, redis_factory):
    """Three Redlock masters besides the coordination Redis: ready with all three and with two; not
    ready with one (forbid jobs could take no lock), and ready again once a second is back."""
    masters = [redis_factory() for _ in range(3)]
    settings.REDIS_URL = masters[0].url
    settings.REDLOCK_URLS = [m.url for m in masters]

    def ready() -> tuple[int, str]:
        response = APIClient().get("/health/ready")
        return response.status_code, response.json()["checks"].get("redlock", "")

    assert ready() == (200, "ok (3 of 3 masters)")
    masters[2].stop()
    assert ready() == (200, "ok (2 of 3 masters)")
    masters[1].stop()
    status, check = ready()
    assert status == 503
    assert check == "error: RuntimeError: 1 of 3 Redlock masters answer; a quorum needs 2"
    masters[1].start()
    assert ready() == (200, "ok (2 of 3 masters)")
    masters[2].start()


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/health/live", "/health/ready"])
def test_health_refuses_writes(url):
    assert APIClient().post(url).status_code == 405


# --- production settings -------------------------------------------------------------------------


def good_secret() -> str:
    return secrets.token_urlsafe(50)


def production_env(tmp_path, **overrides: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    # DATABASE_URL is kept, so a MariaDB run checks the MariaDB configuration.
    env.update(
        DJANGO_SETTINGS_MODULE=PRODUCTION,
        DJANGO_SECRET_KEY=good_secret(),
        DJANGO_ALLOWED_HOSTS="example.com",
        SCHEDULER_VAR_DIR=str(tmp_path),  # nothing written into the checkout
        PYTHONDONTWRITEBYTECODE="1",
    )
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_python(env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")


def test_check_deploy_is_clean_under_production_settings(tmp_path):
    result = check_deploy(production_env(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr
    assert "?: (security." not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"DJANGO_SECRET_KEY": "short"}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": None}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": ""}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "a" * 64}, "DJANGO_SECRET_KEY"),
        (
            {"DJANGO_SECRET_KEY": "django-insecure-" + secrets.token_urlsafe(50)},
            "DJANGO_SECRET_KEY",
        ),
        ({"DJANGO_DEBUG": "1"}, "DJANGO_DEBUG"),
        ({"DJANGO_DEBUG": "true"}, "DJANGO_DEBUG"),
        ({"DJANGO_ALLOWED_HOSTS": None}, "DJANGO_ALLOWED_HOSTS"),
        ({"DJANGO_ALLOWED_HOSTS": ""}, "DJANGO_ALLOWED_HOSTS"),
        ({"SCHEDULER_METRICS_HISTORY_TTL_S": "-1"}, "SCHEDULER_METRICS_HISTORY_TTL_S"),
        ({"SCHEDULER_METRICS_HISTORY_TTL_S": "soon"}, "SCHEDULER_METRICS_HISTORY_TTL_S"),
    ],
    ids=[
        "short-key",
        "missing-key",
        "empty-key",
        "one-char-key",
        "insecure-prefix-key",
        "debug-1",
        "debug-true",
        "no-allowed-hosts",
        "empty-allowed-hosts",
        "negative-metrics-ttl",
        "unreadable-metrics-ttl",
    ],
)
def test_production_settings_refuse_insecure_values(tmp_path, overrides, needle):
    result = check_deploy(production_env(tmp_path, **overrides))
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "ImproperlyConfigured" in output
    assert needle in output


def test_production_settings_values(tmp_path):
    env = production_env(tmp_path)
    script = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({k: getattr(s, k) for k in ["
        "'DEBUG', 'ALLOWED_HOSTS', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', "
        "'SECURE_SSL_REDIRECT', 'SECURE_HSTS_SECONDS', 'SECURE_CONTENT_TYPE_NOSNIFF', "
        "'X_FRAME_OPTIONS', 'SECRET_KEY', 'SECURE_REDIRECT_EXEMPT']}))"
    )
    result = run_python(env, "-c", script)
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout.strip().splitlines()[-1])
    assert values["DEBUG"] is False
    assert values["ALLOWED_HOSTS"] == ["example.com"]
    assert values["SESSION_COOKIE_SECURE"] is True
    assert values["CSRF_COOKIE_SECURE"] is True
    assert values["SECURE_SSL_REDIRECT"] is True
    assert values["SECURE_HSTS_SECONDS"] >= 31536000
    assert values["X_FRAME_OPTIONS"] == "DENY"
    assert values["SECRET_KEY"] == env["DJANGO_SECRET_KEY"]
    # Probes reach health over plain HTTP inside the cluster.
    assert any("health" in pattern for pattern in values["SECURE_REDIRECT_EXEMPT"])
    assert not (tmp_path / "secret_key").exists()  # production never falls back to a file


def test_embedded_secret_key_is_generated_per_installation(tmp_path):
    """Secrets are never shipped in the code: without DJANGO_SECRET_KEY the embedded mode makes a
    random key per installation, stored readable only by its owner."""
    keys = []
    for name in ("one", "two"):
        var_dir = tmp_path / name
        env = production_env(var_dir, DJANGO_SETTINGS_MODULE="scheduler_project.settings")
        env.pop("DJANGO_SECRET_KEY")
        script = "from django.conf import settings; print(settings.SECRET_KEY)"
        result = run_python(env, "-c", script)
        assert result.returncode == 0, result.stderr
        key = result.stdout.strip().splitlines()[-1]
        stored = var_dir / "secret_key"
        assert stored.read_text().strip() == key
        assert (stored.stat().st_mode & 0o777) == 0o600
        assert len(key) >= 50
        keys.append(key)
    assert keys[0] != keys[1]


# --- default (embedded) settings, in process -----------------------------------------------------


def test_api_defaults_are_safe():
    rest = django_settings.REST_FRAMEWORK
    assert rest["DEFAULT_PERMISSION_CLASSES"] == ["jobs.api.permissions.RolePermission"]
    assert rest["DEFAULT_AUTHENTICATION_CLASSES"][0].endswith("TokenAuthentication")
    assert (
        "rest_framework.authentication.SessionAuthentication"
        in rest["DEFAULT_AUTHENTICATION_CLASSES"]
    )
    assert rest["DEFAULT_PARSER_CLASSES"] == ["jobs.api.parsers.BoundedJSONParser"]
    assert (
        django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE == django_settings.SCHEDULER_MAX_REQUEST_BYTES
    )
    assert "django.middleware.csrf.CsrfViewMiddleware" in django_settings.MIDDLEWARE
    assert django_settings.SPECTACULAR_SETTINGS["SWAGGER_UI_DIST"] == "SIDECAR"


def test_probes_answer_a_pod_ip_host_under_production_settings(tmp_path):
    """A kubelet probes ``http://<pod IP>:8000/health/...`` with that IP as its Host, which
    ALLOWED_HOSTS does not list: the probes still answer 200 (they were 400, so the pods would
    never be Ready), while every other path keeps refusing the unknown host."""
    env = production_env(tmp_path, DJANGO_ALLOWED_HOSTS="scheduler.example.com")
    # Readiness checks only a database of the test's own here (SQLite in tmp_path): the suite's
    # MariaDB database name is the test runner's, which a subprocess does not see.
    env.pop("REDIS_URL", None)
    env.pop("DATABASE_URL", None)
    script = (
        "import json, django; django.setup(); from django.test import Client; c = Client(); "
        "host = '10.42.0.17:8000'; "
        "print(json.dumps([c.get(p, HTTP_HOST=host).status_code for p in "
        "['/health/live', '/health/ready', '/api/jobs/', '/']]))"
    )
    result = run_python(env, "-c", script)
    assert result.returncode == 0, result.stderr
    live, ready, api, page = json.loads(result.stdout.strip().splitlines()[-1])
    assert (live, ready) == (200, 200), result.stderr
    assert (api, page) == (400, 400)


def test_a_cache_error_while_redis_is_down_is_one_warning_line(settings, caplog):
    """django-redis logs each error it ignores with a traceback (every API call's throttle while
    Redis is down); the logging config makes it one line naming the cause."""
    import socket

    from django_redis.cache import RedisCache

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    settings.DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
    cache = RedisCache(
        f"redis://127.0.0.1:{closed}/0",
        {"OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 0.5, "IGNORE_EXCEPTIONS": True}},
    )
    caplog.set_level("WARNING", logger="django_redis.cache")
    assert cache.get("anything") is None  # ignored: the call goes on
    [record] = [r for r in caplog.records if r.name == "django_redis.cache"]
    assert record.levelname == "WARNING" and record.exc_info is None
    assert record.getMessage().startswith("cache unavailable, going on without it: ")
    assert "Connection" in record.getMessage()


def test_no_staticfiles_warning_at_start_before_collectstatic(tmp_path) -> None:
    """Embedded mode serves the static files from the finders: starting the web app without a
    collected staticfiles/ directory says nothing about it (it warned at every start)."""
    script = (
        "import django; django.setup(); "
        "from django.core.wsgi import get_wsgi_application; get_wsgi_application()"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "DJANGO_STATIC_ROOT": str(tmp_path / "not-collected"),
        "SCHEDULER_VAR_DIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "No directory at" not in done.stderr
