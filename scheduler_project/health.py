"""Liveness and readiness probes: the only endpoints (with metrics) that need no login.

``ProbeMiddleware`` answers them before any other middleware, so they never read the Host header: a
kubelet probes a pod by its IP (``Host: 10.42.0.17:8000``), which ALLOWED_HOSTS rightly does not
list, and every host check (CommonMiddleware, the HTTPS redirect) would answer it 400."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)

REDIS_PROBE_TIMEOUT_S = 0.5


@never_cache
@require_GET
def live(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def _check_redis() -> str:
    _ping(settings.REDIS_URL)
    return "ok"


def _ping(url: str) -> None:
    import redis

    client = redis.Redis.from_url(
        url, socket_timeout=REDIS_PROBE_TIMEOUT_S, socket_connect_timeout=REDIS_PROBE_TIMEOUT_S
    )
    try:
        client.ping()
    finally:
        client.close()


def _check_redlock() -> str:
    """The Redlock masters, asked in parallel: ready while a quorum answers (job locks of forbid
    jobs need one; with fewer, such runs wait)."""
    urls = settings.REDLOCK_URLS
    quorum = len(urls) // 2 + 1
    with ThreadPoolExecutor(max_workers=len(urls)) as pool:
        answers = list(pool.map(lambda url: _try(_ping, url), urls))
    up = sum(answers)
    if up < quorum:
        raise RuntimeError(f"{up} of {len(urls)} Redlock masters answer; a quorum needs {quorum}")
    return f"ok ({up} of {len(urls)} masters)"


def _try(probe: Callable[[str], None], url: str) -> bool:
    try:
        probe(url)
    except Exception as exc:
        logger.warning("readiness: redlock master unavailable: %s", exc)
        return False
    return True


@never_cache
@require_GET
def ready(request: HttpRequest) -> JsonResponse:
    """200 when the database, the coordination Redis and a quorum of the Redlock masters (when
    they are other servers than REDIS_URL) answer; else 503 naming what does not."""
    checks: dict[str, str] = {}
    probes = {"database": _check_database}
    if settings.REDIS_URL:
        probes["redis"] = _check_redis
    if settings.REDLOCK_URLS and settings.REDLOCK_URLS != [settings.REDIS_URL]:
        probes["redlock"] = _check_redlock
    healthy = True
    for name, probe in probes.items():
        started = time.monotonic()
        try:
            checks[name] = probe()
        except Exception as exc:  # any failure of a dependency means "not ready"
            healthy = False
            checks[name] = f"error: {type(exc).__name__}" + (
                f": {exc}" if name == "redlock" else ""
            )
            logger.warning("readiness: %s unavailable: %s", name, exc)
        checks[f"{name}_ms"] = f"{(time.monotonic() - started) * 1000:.1f}"
    return JsonResponse(
        {"status": "ok" if healthy else "unavailable", "checks": checks},
        status=200 if healthy else 503,
    )


def _metrics(request: HttpRequest) -> HttpResponse:
    from scheduler_project.metrics import metrics

    return metrics(request)


PROBES: dict[str, Callable[[HttpRequest], HttpResponse]] = {
    "/health/live": live,
    "/health/ready": ready,
    "/metrics": _metrics,
}


class ProbeMiddleware:
    """First in MIDDLEWARE: a probe is answered here, whatever the Host. Nothing else is."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        probe = PROBES.get(request.path_info)
        if probe is not None:
            return probe(request)
        return self.get_response(request)
