"""The settings the scheduler's apps read, each with the default a project gets when it sets none.

A project that adds ``jobs``, ``cluster`` and ``dashboard`` to its own settings sets only what it
wants to change (``SCHEDULER_COORDINATION = "redis"``, ``REDIS_URL = ...``); the apps read every
value through :func:`app_setting`, never ``settings.<NAME>`` directly, so a setting left out is its
default here, not an AttributeError at the first run. The node's knobs (``SCHEDULER = {...}``) are
``cluster.conf``'s. ``docs/configuration.md`` says what each one means.

Nothing here may import models: settings modules and app configs import it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Coordination: "redis" when REDIS_URL is set, else the database (see app_setting).
    "SCHEDULER_COORDINATION": "database",
    "REDIS_URL": "",
    "REDLOCK_URLS": [],
    "SCHEDULER_REDIS_PREFIX": "djsched",
    # Bounds of what the API and the job definitions accept.
    "SCHEDULER_MAX_REQUEST_BYTES": 256 * 1024,
    "SCHEDULER_MAX_ARGS_BYTES": 64 * 1024,
    "SCHEDULER_MAX_ARGS_DEPTH": 16,
    "SCHEDULER_TOKEN_TTL_DAYS": 90,
    # Tasks: extra modules to import, and what the built-in tasks may reach.
    "SCHEDULER_TASK_MODULES": [],
    "SCHEDULER_SECRETS_DIR": "",
    "SCHEDULER_HTTP_ALLOWED_HOSTS": [],
    "SCHEDULER_HTTP_MAX_TIMEOUT_S": 30,
    "SCHEDULER_ALLOWED_COMMANDS": [],
    # Example jobs on an empty installation: off unless a project asks for them.
    "SCHEDULER_EXAMPLE_JOBS": False,
    # A node's database connections: idle-in-transaction bound, and what the web processes need.
    "SCHEDULER_IDLE_TRANSACTION_TIMEOUT_S": 1,
    "SCHEDULER_WEB_DB_CONNECTIONS": 20,
    # Where a process keeps its own files (the bootstrap admin's password).
    "VAR_DIR": Path("var"),
    # The demo tasks (runcluster's demo), off in production.
    "SCHEDULER_DEMO_TASKS": False,
    # Notifications: the dashboard's address for their links, and the webhooks' signing secret.
    "SCHEDULER_BASE_URL": "",
    "SCHEDULER_WEBHOOK_SECRET": "",
    # The live feed's pace (seconds): polls of the database, rechecks, look-back, idle polls.
    "SCHEDULER_LIVE_POLL_S": 0.05,
    "SCHEDULER_LIVE_RECHECK_S": 2.0,
    "SCHEDULER_LIVE_LOOKBACK_S": 5.0,
    "SCHEDULER_LIVE_IDLE_POLL_S": 1.0,
}


def app_setting(name: str) -> Any:
    """``settings.<name>`` if the project sets it, else its default here (KeyError: not a setting
    of the scheduler's)."""
    if hasattr(settings, name):
        return getattr(settings, name)
    if name == "SCHEDULER_COORDINATION":  # as this repository's settings: Redis once it has one
        return "redis" if app_setting("REDIS_URL") else "database"
    return DEFAULTS[name]
