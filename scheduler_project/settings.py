"""Settings, read from the environment.

Every variable read here is documented in docs/configuration.md. The defaults give the embedded
mode: a SQLite file under ``var/`` and database coordination, no Redis needed. Production mode lives in
``scheduler_project.settings_production``, which imports this module and refuses insecure values.
"""

from __future__ import annotations

import os
import secrets
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from cluster import conf as scheduler_settings
from jobs.api import settings as api_settings
from jobs.conf import DEFAULTS as APP_DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SCHEDULER_VAR_DIR", BASE_DIR / "var"))


# A setting the apps read takes its default from jobs.conf (the one home of each: a project of its
# own gets the same); the environment overrides it here. A default given below differs on purpose.
_APP = object()


def _default(name: str, default: object) -> Any:
    return APP_DEFAULTS[name] if default is _APP else default


def env_str(name: str, default: object = _APP) -> str:
    return os.environ.get(name, _default(name, default))


def env_bool(name: str, default: object = _APP) -> bool:
    default = _default(name, default)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def env_int(name: str, default: object = _APP) -> int:
    default = _default(name, default)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def _embedded_secret_key() -> str:
    """A per-installation key kept in var/ for the embedded mode: never a key shipped in the code."""
    path = VAR_DIR / "secret_key"
    if path.exists():
        return path.read_text().strip()
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process started at the same moment and wrote it first
        time.sleep(0.1)
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(key)
    return key


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or _embedded_secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Before the API's apps: its templates override a few of theirs (the browsable API's page,
    # ReDoc's); its pages, files and the rest are its own (templates/dashboard/, static/dashboard/).
    "dashboard",
    "rest_framework",
    # Only for the migration that moves its clear-text keys into jobs.ApiToken as digests.
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "jobs",
    "cluster",
    # The verifier (manage.py chaos): drives a cluster from outside; nothing of it runs on a node.
    "chaos",
]

MIDDLEWARE = [
    # Health probes, answered whatever the Host (a kubelet probes the pod IP): see health.py.
    "scheduler_project.health.ProbeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "scheduler_project.security.ContentSecurityPolicyMiddleware",
    "scheduler_project.security.ChunkedBodyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a locked-out login into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

# --- Login throttling (django-axes), on every password login: dashboard, admin, API browser -----
# After SCHEDULER_LOGIN_FAILURE_LIMIT wrong passwords for one username from one address, that
# username is refused from that address (429, even with the right password) for
# SCHEDULER_LOGIN_LOCKOUT_MINUTES; a successful login clears the count. Locking by the pair, not by
# username alone, means an attacker cannot lock a user out everywhere by guessing from elsewhere.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("SCHEDULER_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("SCHEDULER_LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
# 429 with Retry-After, JSON for API clients and an HTML page for browsers (axes: plain text).
AXES_LOCKOUT_CALLABLE = "scheduler_project.lockout.lockout_response"
AXES_VERBOSE = False

ROOT_URLCONF = "scheduler_project.urls"
WSGI_APPLICATION = "scheduler_project.wsgi.application"
ASGI_APPLICATION = "scheduler_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------------
DEFAULT_DATABASE_URL = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
DATABASE_URL = os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL
DATABASES = {
    "default": dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DJANGO_CONN_MAX_AGE", 60))
}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    # Several node processes share one SQLite file: WAL lets readers run beside the writer, IMMEDIATE
    # takes the write lock at BEGIN (no deadlock-prone lock upgrades), the timeout waits for it.
    _db["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    # Tests run several processes against the test database, so it must be a file, not :memory:.
    _db["TEST"] = {"NAME": os.environ.get("SCHEDULER_TEST_DB", str(VAR_DIR / "test_db.sqlite3"))}
    _db["CONN_MAX_AGE"] = 0
elif _db["ENGINE"] in {"django.db.backends.mysql"}:
    _db["OPTIONS"] = {
        "charset": "utf8mb4",
        "init_command": "SET sql_mode='STRICT_TRANS_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,"
        "ERROR_FOR_DIVISION_BY_ZERO', innodb_lock_wait_timeout=10",
        "isolation_level": "read committed",
        # A database behind a partition (no reset, no answer) must fail a call, not hang the
        # thread that made it: a node's loops would stall with their claims and locks. The
        # read/write bound stays above innodb_lock_wait_timeout (10 s) so a lock wait ends first.
        "connect_timeout": env_int("SCHEDULER_DB_CONNECT_TIMEOUT_S", 5),
        "read_timeout": env_int("SCHEDULER_DB_IO_TIMEOUT_S", 20),
        "write_timeout": env_int("SCHEDULER_DB_IO_TIMEOUT_S", 20),
    }
    _db["TEST"] = {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"}
    if os.environ.get("SCHEDULER_TEST_DB"):
        _db["TEST"]["NAME"] = os.environ["SCHEDULER_TEST_DB"]
else:
    raise ImproperlyConfigured(
        f"DATABASE_URL must point at SQLite or MySQL/MariaDB, got engine {_db['ENGINE']}"
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, coordination, channels ----------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")
REDLOCK_URLS = env_list("REDLOCK_URLS") or ([REDIS_URL] if REDIS_URL else [])
SCHEDULER_COORDINATION = os.environ.get(
    "SCHEDULER_COORDINATION", "redis" if REDIS_URL else "database"
)
if SCHEDULER_COORDINATION not in {"redis", "database"}:
    raise ImproperlyConfigured("SCHEDULER_COORDINATION must be 'redis' or 'database'")
if SCHEDULER_COORDINATION == "redis" and not REDIS_URL:
    raise ImproperlyConfigured("SCHEDULER_COORDINATION=redis needs REDIS_URL")
# Prefix of every Redis key this installation writes, so several installations (or test runs) can
# share one Redis server.
SCHEDULER_REDIS_PREFIX = env_str("SCHEDULER_REDIS_PREFIX")
# A node's knobs (capacity, queues, heartbeat, presence TTL, lease timing, drain grace, metrics
# port): defaults, SCHEDULER_<KEY> variables, checked together; runnode's flags override them.
SCHEDULER = scheduler_settings.load()

if REDIS_URL:
    CHANNEL_LAYERS = scheduler_settings.redis_channel_layers(REDIS_URL, SCHEDULER_REDIS_PREFIX)
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Tasks: where they come from, what built-in tasks may reach ------------------------------------
# Extra modules to import for @task registrations, besides every installed app's tasks.py.
SCHEDULER_TASK_MODULES = env_list("SCHEDULER_TASK_MODULES")
# The demo tasks (jobs/demo_tasks.py: demo_ticker, demo_fail, demo_report, demo_flaky): on in the
# embedded default, off under the production settings unless asked for.
SCHEDULER_DEMO_TASKS = env_bool("SCHEDULER_DEMO_TASKS", True)
# Example jobs created by runcluster (make run) on a database that never had a job
# (jobs/examples.py): on in the embedded default, off under the production settings unless asked.
SCHEDULER_EXAMPLE_JOBS = env_bool("SCHEDULER_EXAMPLE_JOBS", True)

# --- Failure notifications (jobs/notifications.py) ------------------------------------------------
# The dashboard's address, for the links in notifications (e.g. https://scheduler.example.com).
SCHEDULER_BASE_URL = env_str("SCHEDULER_BASE_URL")
# When set, webhooks carry X-Scheduler-Signature: sha256=<HMAC-SHA256 of the body with it>.
SCHEDULER_WEBHOOK_SECRET = env_str("SCHEDULER_WEBHOOK_SECRET")
# E-mail goes through Django's mail backend: SMTP at EMAIL_HOST:EMAIL_PORT when EMAIL_HOST is set,
# otherwise written to the node's log (the console backend).
EMAIL_HOST = os.environ.get("EMAIL_HOST", "")
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = os.environ.get("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "scheduler@localhost")
# Hosts the http_request task may call (exact host names; empty = none). Nothing else is reachable.
SCHEDULER_HTTP_ALLOWED_HOSTS = env_list("SCHEDULER_HTTP_ALLOWED_HOSTS")
# Where a node looks for a secret a task's arguments reference ({"$secret": "NAME"}) when the
# variable SCHEDULER_SECRET_NAME is not set: the file <dir>/NAME (see jobs/secrets.py).
SCHEDULER_SECRETS_DIR = env_str("SCHEDULER_SECRETS_DIR")
# /metrics is served only when this is set, to scrapes sending "Authorization: Bearer <token>".
SCHEDULER_METRICS_TOKEN = os.environ.get("SCHEDULER_METRICS_TOKEN", "")
# Finished runs are counted for /metrics at most once per this many seconds in each web process
# (the count reads every such row); runs pending, running or awaiting a retry at every scrape.
SCHEDULER_METRICS_HISTORY_TTL_S = env_int("SCHEDULER_METRICS_HISTORY_TTL_S", 60)
if SCHEDULER_METRICS_HISTORY_TTL_S < 0:
    raise ImproperlyConfigured(
        f"SCHEDULER_METRICS_HISTORY_TTL_S must be 0 or more, got {SCHEDULER_METRICS_HISTORY_TTL_S}"
    )
SCHEDULER_HTTP_MAX_TIMEOUT_S = env_int("SCHEDULER_HTTP_MAX_TIMEOUT_S")
# Management commands the management_command task may run (empty = none).
SCHEDULER_ALLOWED_COMMANDS = env_list("SCHEDULER_ALLOWED_COMMANDS")
# Largest JSON request body the API accepts, and largest args/kwargs a job may carry.
SCHEDULER_MAX_REQUEST_BYTES = env_int("SCHEDULER_MAX_REQUEST_BYTES")
SCHEDULER_MAX_ARGS_BYTES = env_int("SCHEDULER_MAX_ARGS_BYTES")
# How deep a job's (or a run's) args/kwargs may nest lists and objects (args itself is level 1); a
# JSON body may nest a few levels more (the job or run around them). Far below Python's recursion
# limit: deeper input was a RecursionError (a 500) in the checks that walk it. At most 30: MariaDB
# refuses to store JSON nested 32 levels deep (its JSON_VALID check), and the row adds a level.
SCHEDULER_MAX_ARGS_DEPTH = env_int("SCHEDULER_MAX_ARGS_DEPTH")
if not 1 <= SCHEDULER_MAX_ARGS_DEPTH <= 30:
    raise ImproperlyConfigured(
        f"SCHEDULER_MAX_ARGS_DEPTH must be between 1 and 30, got {SCHEDULER_MAX_ARGS_DEPTH}"
    )
# API keys expire this many days after they are issued unless issued with another lifetime (0:
# never). Only their SHA-256 digest is stored.
SCHEDULER_TOKEN_TTL_DAYS = env_int("SCHEDULER_TOKEN_TTL_DAYS")
DATA_UPLOAD_MAX_MEMORY_SIZE = SCHEDULER_MAX_REQUEST_BYTES

# --- Auth, API ------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard:home"
LOGOUT_REDIRECT_URL = "login"


def redis_cache(url: str, prefix: str) -> dict:
    """The cache on Redis: shared by every process (API throttles). Redis unreachable, it answers
    "nothing stored" (logged) and the API goes on without its rate limits, rather than failing
    every request."""
    return {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "KEY_PREFIX": f"{prefix}:cache",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 1, "SOCKET_TIMEOUT": 1, "IGNORE_EXCEPTIONS": True},
    }


# The cache: Redis when REDIS_URL is set, else this process's memory (the embedded mode runs one
# web process).
if REDIS_URL:
    CACHES = {"default": redis_cache(REDIS_URL, SCHEDULER_REDIS_PREFIX)}
    DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS = True
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

REST_FRAMEWORK = api_settings.rest_framework(
    # Per user (token or session) for every call, stricter for writes; per address when anonymous.
    # Counted in the cache: shared by every web process when REDIS_URL is set (see CACHES).
    anon_rate=os.environ.get("SCHEDULER_API_RATE_ANON", "60/min"),
    user_rate=os.environ.get("SCHEDULER_API_RATE_USER", "1200/min"),
    writes_rate=os.environ.get("SCHEDULER_API_RATE_WRITES", "300/min"),
)
SPECTACULAR_SETTINGS = api_settings.SPECTACULAR_SETTINGS

# --- i18n, static ---------------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", BASE_DIR / "staticfiles"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Serve straight from the finders when collectstatic has not run (embedded mode, tests).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
if not STATIC_ROOT.is_dir():
    # The finders serve every file then: WhiteNoise's "No directory at: staticfiles/" at each
    # start says nothing an operator must act on (production settings serve collected files only).
    warnings.filterwarnings("ignore", message="No directory at: ", category=UserWarning)

# --- Logging --------------------------------------------------------------------------------------
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO").upper()
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "cluster.logcontext.JsonFormatter"},
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s%(context)s"},
    },
    "filters": {
        "context": {"()": "cluster.logcontext.ContextFilter"},
        "one_line_cache_errors": {"()": "cluster.logcontext.OneLineCacheErrors"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "text",
            "filters": ["context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "INFO"},
        "django_redis.cache": {"filters": ["one_line_cache_errors"]},
    },
}

# On MariaDB, a node frozen inside a transaction (SIGSTOP, a paused VM) would hold its row locks
# (the fence row among them) until it resumes. The server kills a node's connection after this many
# idle seconds inside a transaction, rolling it back (see cluster.apps); runnode refuses a value not
# below the renew deadline, so nothing frozen holds the cluster longer than a lease. 0 disables it.
SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S = env_int("SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S")
# Connections kept free for the web processes, the dashboard and operators' tools when runnode checks
# that nodes x their connection budget fit the server's max_connections (MariaDB).
SCHEDULER_WEB_DB_CONNECTIONS = env_int("SCHEDULER_WEB_DB_CONNECTIONS")

# --- Live dashboard (dashboard.live, docs/live-protocol.md) ---------------------------------------
# Read by dashboard.live when the first dashboard connects (tests override them with settings).


def env_float(name: str, default: object = _APP, *, minimum: float = 0.0) -> float:
    default = _default(name, default)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc
    if not value > minimum:
        raise ImproperlyConfigured(f"{name} must be greater than {minimum}, got {raw!r}")
    return value


# Seconds between two database polls of a web process while at least one dashboard is connected
# (the shortest gap between two polls when the doorbell below rings).
SCHEDULER_LIVE_POLL_S = env_float("SCHEDULER_LIVE_POLL_S")
# With Redis coordination, a poll runs when the doorbell rings (a process committed a change) and,
# as a fallback, at least this often.
SCHEDULER_LIVE_IDLE_POLL_S = env_float("SCHEDULER_LIVE_IDLE_POLL_S")
if SCHEDULER_LIVE_IDLE_POLL_S < SCHEDULER_LIVE_POLL_S:
    raise ImproperlyConfigured("SCHEDULER_LIVE_IDLE_POLL_S must not be below SCHEDULER_LIVE_POLL_S")
# Seconds between re-checks that connected users are still logged in, active and hold a role.
SCHEDULER_LIVE_RECHECK_S = env_float("SCHEDULER_LIVE_RECHECK_S")
# Seconds a poll looks back for rows committed after newer ones (slow commits, writer clock skew).
SCHEDULER_LIVE_LOOKBACK_S = env_float("SCHEDULER_LIVE_LOOKBACK_S")
# --- end of live dashboard settings -----------------------------------------------------------------
