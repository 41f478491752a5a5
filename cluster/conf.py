"""The scheduler node's knobs in one place: ``settings.SCHEDULER``.

Each has a default here, may be set in the environment as ``SCHEDULER_<KEY>`` (``SCHEDULER_CAPACITY=16``,
``SCHEDULER_QUEUES=default,reports``), and ``runnode``'s flag of the same name overrides both for one
process. Values are checked when the settings load: a wrong type, a value out of range, or knobs that
cannot work together (a renew deadline not below the lease TTL, a presence TTL not above two
heartbeats) stop the process with the variable named, before anything runs.

Imported by the settings module: nothing here may import Django models or apps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured


def _queues(raw: str) -> list[str]:
    return [q.strip() for q in raw.split(",") if q.strip()]


def cpu_list(raw: str) -> list[int]:
    """``"0,2"`` -> [0, 2] (ValueError for anything but comma-separated CPU numbers)."""
    return sorted({int(part) for part in raw.split(",") if part.strip()})


def _cpus_problem(value: list[int]) -> str | None:
    """Why a node cannot pin itself to these CPUs (cluster.affinity), None if it can."""
    if not value:
        return None
    if not hasattr(os, "sched_getaffinity"):
        return "CPU pinning is not supported on this platform"
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(value) - allowed)
    if missing:
        return f"CPUs {missing} are not available to this process (it may use {sorted(allowed)})"
    return None


# key: (default, parse from the environment's text, check -> error text or None)
KNOBS: dict[str, tuple[Any, Callable[[str], Any], Callable[[Any], str | None]]] = {
    "CAPACITY": (8, int, lambda v: None if v >= 1 else "must be at least 1"),
    "QUEUES": (["default"], _queues, lambda v: None if v else "must name at least one queue"),
    "HEARTBEAT_S": (0.5, float, lambda v: None if v > 0 else "must be positive"),
    "DEAD_AFTER_S": (2.0, float, lambda v: None if v > 0 else "must be positive"),
    "LOOKAHEAD_S": (1.0, float, lambda v: None if 0 <= v <= 60 else "must be within 0-60"),
    "LEASE_TTL_MS": (2000, int, lambda v: None if v >= 100 else "must be at least 100"),
    "RENEW_DEADLINE_MS": (1500, int, lambda v: None if v >= 50 else "must be at least 50"),
    "RETRY_PERIOD_MS": (250, int, lambda v: None if v >= 10 else "must be at least 10"),
    "DRAIN_GRACE_S": (30.0, float, lambda v: None if v >= 0 else "must not be negative"),
    # One database statement on a node's control path (the leader, the reaper, the heartbeat, the
    # notifier) may run this long on the server; unanswered a little longer, the database counts
    # as unreachable and a leader releases its lease (cluster.dbhealth).
    "DB_CONTROL_LIMIT_S": (
        1.0,
        float,
        lambda v: None if 0.1 <= v <= 60 else "must be within 0.1-60 seconds",
    ),
    # The leader warns once when fires or claims fall this far behind (cluster.behind).
    "BEHIND_WARN_S": (
        5.0,
        float,
        lambda v: None if 0.5 <= v <= 3600 else "must be within 0.5-3600 seconds",
    ),
    # Runs released from misfire catch-up, a second, across the cluster (0: no bound); see
    # jobs.firing.pace_catch_up. Each partition's leader paces its own jobs at its share.
    "CATCH_UP_PER_S": (
        50.0,
        float,
        lambda v: None if 0 <= v <= 100_000 else "must be within 0 (no bound) and 100000",
    ),
    # Jobs a node process keeps as its claims last read them (jobs.executions.rows); 0: none.
    "JOB_CACHE_SIZE": (
        10_000,
        int,
        lambda v: None if 0 <= v <= 10_000_000 else "must be within 0 (no cache) and 10000000",
    ),
    "METRICS_PORT": (0, int, lambda v: None if 0 <= v <= 65535 else "must be 0 (off) or a port"),
    "METRICS_HOST": ("0.0.0.0", str, lambda v: None if v else "must not be empty"),  # noqa: S104
    # [] (default): not pinned; see cluster.affinity.
    "CPUS": ([], cpu_list, _cpus_problem),
}


# How long past DB_CONTROL_LIMIT_S an unanswered control call waits on the network (seconds; the
# value of cluster.dbhealth.STALL_MARGIN_S, which a test keeps equal).
DB_STALL_MARGIN_S = 0.25


def default(key: str) -> Any:
    """A knob's default: the one home of every node default (``NodeConfig``, ``ElectionConfig``
    and ``runnode`` take theirs from here)."""
    value = KNOBS[key][0]
    return list(value) if isinstance(value, list) else value


def election_problem(lease_ttl_ms: int, renew_deadline_ms: int, retry_period_ms: int) -> str | None:
    """The election's timing rule (lease > renew deadline > retry period > 0), as client-go
    insists; None when it holds."""
    if renew_deadline_ms >= lease_ttl_ms:
        return "RENEW_DEADLINE_MS must be below LEASE_TTL_MS (a leader gives up before it expires)"
    if retry_period_ms >= renew_deadline_ms:
        return "RETRY_PERIOD_MS must be below RENEW_DEADLINE_MS (several tries per deadline)"
    if retry_period_ms <= 0:
        return "RETRY_PERIOD_MS must be positive"
    return None


def together(values: Mapping[str, Any]) -> str | None:
    """What is wrong with these knobs as a set (None: they work together)."""
    if values["DEAD_AFTER_S"] <= 2 * values["HEARTBEAT_S"]:
        return "DEAD_AFTER_S must exceed two HEARTBEAT_S (a late heartbeat is not a death)"
    problem = election_problem(
        values["LEASE_TTL_MS"], values["RENEW_DEADLINE_MS"], values["RETRY_PERIOD_MS"]
    )
    if problem:
        return problem
    if values["DB_CONTROL_LIMIT_S"] + DB_STALL_MARGIN_S >= values["RENEW_DEADLINE_MS"] / 1000:
        return (
            f"DB_CONTROL_LIMIT_S + {DB_STALL_MARGIN_S:g} s must be below RENEW_DEADLINE_MS (a "
            "leader cut off from its database must notice before its renew deadline)"
        )
    return None


def values_problem(values: Mapping[str, Any]) -> str | None:
    """What is wrong with knob values already parsed (a node's config built in code): each one's
    own check, then the set's; None when they are right. Knobs not given take their defaults."""
    full = {key: values.get(key, default(key)) for key in KNOBS}
    for key, value in values.items():
        problem = KNOBS[key][2](value)
        if problem:
            return f"{key}: {problem}"
    return together(full)


def _knob(key: str, raw: Any, label: str) -> Any:
    """One knob's value from ``raw`` (text is parsed), checked; ImproperlyConfigured naming
    ``label`` (``SCHEDULER_CAPACITY`` or ``SCHEDULER['CAPACITY']``) and the value."""
    default, parse, check = KNOBS[key]
    value = raw
    if isinstance(raw, str) and parse is not str:
        try:
            value = parse(raw)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{label}={raw!r}: not a {parse.__name__}") from exc
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or isinstance(value, bool):
        raise ImproperlyConfigured(f"{label}={raw!r}: must be a {expected.__name__}")
    problem = check(value)
    if problem:
        raise ImproperlyConfigured(f"{label}={raw!r}: {problem}")
    return value


def _all_knobs(given: Mapping[str, Any], label: Callable[[str], str], where: str) -> dict[str, Any]:
    """Every knob: the given ones checked, the rest their defaults; then the set as a whole."""
    values = {
        key: _knob(key, given[key], label(key)) if key in given else default
        for key, (default, _, _) in KNOBS.items()
    }
    problem = together(values)
    if problem:
        raise ImproperlyConfigured(f"{where}: {problem}")
    return values


def load(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``settings.SCHEDULER``: the defaults, overridden by ``SCHEDULER_<KEY>`` variables, checked."""
    environ = os.environ if environ is None else environ
    given = {key: environ[f"SCHEDULER_{key}"] for key in KNOBS if environ.get(f"SCHEDULER_{key}")}
    return _all_knobs(given, lambda key: f"SCHEDULER_{key}", "SCHEDULER_*")


def from_mapping(given: Mapping[str, Any], *, where: str = "SCHEDULER") -> dict[str, Any]:
    """A project's ``SCHEDULER = {...}``: the defaults for every knob it leaves out, each given
    one checked (its type and range), and the whole set checked together. Raises
    ImproperlyConfigured naming the key."""
    if not isinstance(given, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of knobs, not {type(given).__name__}")
    unknown = sorted(set(given) - set(KNOBS))
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; the knobs are "
            f"{', '.join(KNOBS)}"
        )
    return _all_knobs(given, lambda key: f"{where}[{key!r}]", where)


_checked: tuple[dict[str, Any], dict[str, Any]] | None = None


def knobs() -> dict[str, Any]:
    """This installation's node knobs: ``settings.SCHEDULER`` (absent: every default), checked
    once per value of it (a dashboard request reads them; the check reads the CPUs allowed)."""
    from django.conf import settings  # this module loads inside the settings module itself

    global _checked
    raw = getattr(settings, "SCHEDULER", {})
    if not isinstance(raw, Mapping):
        return from_mapping(raw)  # refused, naming the setting
    given = dict(raw)
    seen = _checked
    if seen is not None and seen[0] == given:
        return dict(seen[1])
    values = from_mapping(given)
    _checked = (given, values)
    return dict(values)


def with_overrides(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with the given values (a process's flags; None: not given), checked the same way.
    Raises ValueError naming the flag."""
    values = dict(base)
    for key, value in overrides.items():
        if value is None:
            continue
        problem = KNOBS[key][2](value)
        if problem:
            raise ValueError(f"--{key.lower().replace('_', '-')}: {problem}")
        values[key] = value
    problem = together(values)
    if problem:
        raise ValueError(problem)
    return values


# channels-redis waits for a message in one blocking read of up to 5 s (BZPOPMIN, its
# brpop_timeout); redis-py (from 6 on) gives up a read after 5 s by default. The two raced: an
# idle dashboard's socket crashed with "Timeout reading from Redis" about every 5 s. A read on the
# channel layer's connections may take this long instead.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 30.0
CHANNEL_LAYER_CONNECT_TIMEOUT_S = 5.0


def redis_channel_layers(url: str, prefix: str) -> dict[str, Any]:
    """``CHANNEL_LAYERS`` over the Redis at ``url``, its keys under ``<prefix>:asgi``."""
    host = {
        "address": url,
        "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CHANNEL_LAYER_CONNECT_TIMEOUT_S,
    }
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": f"{prefix}:asgi"},
        }
    }
