"""Production settings: the same code, secure defaults, and a refusal to start with insecure values.

Use with ``DJANGO_SETTINGS_MODULE=scheduler_project.settings_production``.
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from scheduler_project.settings import *  # noqa: F403
from scheduler_project.settings import env_bool, env_int

MIN_SECRET_KEY_LENGTH = 50
MIN_SECRET_KEY_UNIQUE_CHARS = 5

_secret = os.environ.get("DJANGO_SECRET_KEY", "")
if (
    len(_secret) < MIN_SECRET_KEY_LENGTH
    or len(set(_secret)) < MIN_SECRET_KEY_UNIQUE_CHARS
    or _secret.startswith("django-insecure")
):
    raise ImproperlyConfigured(
        "Production mode needs DJANGO_SECRET_KEY from the environment: at least "
        f"{MIN_SECRET_KEY_LENGTH} characters, {MIN_SECRET_KEY_UNIQUE_CHARS} distinct, "
        "not 'django-insecure-...'. Generate one with: python -c "
        "'import secrets; print(secrets.token_urlsafe(50))'"
    )
SECRET_KEY = _secret

if env_bool("DJANGO_DEBUG", False):
    raise ImproperlyConfigured("Production mode refuses DJANGO_DEBUG=1")
DEBUG = False
SCHEDULER_DEMO_TASKS = env_bool("SCHEDULER_DEMO_TASKS", False)
SCHEDULER_EXAMPLE_JOBS = env_bool("SCHEDULER_EXAMPLE_JOBS", False)
if not os.environ.get("DJANGO_ALLOWED_HOSTS"):
    raise ImproperlyConfigured("Production mode needs DJANGO_ALLOWED_HOSTS (comma-separated)")

SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# Health and metrics are probed over plain HTTP inside the cluster network.
SECURE_REDIRECT_EXEMPT = [r"^health/", r"^metrics$"]
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if env_bool("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # Login throttling counts failures per client address: the one the proxy saw, not the
    # proxy's own (one trusted proxy in front).
    AXES_IPWARE_PROXY_COUNT = 1
    AXES_IPWARE_META_PRECEDENCE_ORDER = ["HTTP_X_FORWARDED_FOR", "REMOTE_ADDR"]
WHITENOISE_USE_FINDERS = False
LOG_FORMAT = os.environ.get("LOG_FORMAT", "json")
LOGGING["handlers"]["console"]["formatter"] = "json" if LOG_FORMAT == "json" else "text"  # noqa: F405
