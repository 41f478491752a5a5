"""Built-in tasks. Autodiscovered because the ``jobs`` app has a ``tasks`` module.

Every task takes JSON arguments only and runs in-process: none of them starts a shell or another
program. What a task may reach is bounded by settings, checked both when a job is created (the
task's ``validate`` hook) and again when it runs, because settings may change in between:

* ``http_request`` only calls hosts in ``SCHEDULER_HTTP_ALLOWED_HOSTS`` (and follows no redirect to
  any other host), with a timeout of at most ``SCHEDULER_HTTP_MAX_TIMEOUT_S``;
* ``management_command`` only runs commands in ``SCHEDULER_ALLOWED_COMMANDS``.
"""

from __future__ import annotations

import io
import logging
import math
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from django.core.management import call_command, get_commands

from jobs.conf import app_setting
from jobs.registry import TaskArgumentError, TaskContext, TaskError, bind_arguments, task

MAX_SLEEP_S = 86400
SLEEP_SLICE_S = 0.25
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
MAX_LOG_MESSAGE_CHARS = 10_000
HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
HTTP_SCHEMES = ("http", "https")
HTTP_BODY_PREVIEW_BYTES = 4 * 1024
# A response body is read (and counted) up to this many bytes; the rest is not downloaded.
HTTP_MAX_RESPONSE_BYTES = 10 * 1024 * 1024
HTTP_READ_CHUNK = 64 * 1024

task_logger = logging.getLogger("jobs.tasks.log")


class _Refused(Exception):
    """A parameter value a task refuses; turned into TaskArgumentError naming args or kwargs."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message


class HTTPStatusError(TaskError):
    """The HTTP response status was not one the job expects."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _validator(func_name: str, check: Callable[..., None]) -> Callable[[list, dict], None]:
    """A ``validate`` hook: bind the job's args/kwargs to the task, then check the bound values."""

    def validate(args: list, kwargs: dict) -> None:
        func = globals()[func_name]
        bound = bind_arguments(func, args, kwargs, takes_context=True)
        if bound is None:  # pragma: no cover - the built-ins all have inspectable signatures
            return
        positional = {
            name
            for name, _ in zip(bound.signature.parameters, args, strict=False)
            if name != "context"
        }
        try:
            check(**bound.arguments)
        except _Refused as exc:
            field = "args" if exc.param in positional else "kwargs"
            raise TaskArgumentError(field, exc.message) from None

    validate.__qualname__ = f"validate_{func_name}"
    return validate


def _at_run_time(check: Callable[..., None], **values: Any) -> None:
    """Repeat the creation-time checks when the task runs (settings may have changed)."""
    try:
        check(**values)
    except _Refused as exc:
        raise TaskArgumentError("kwargs", exc.message) from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- noop -----------------------------------------------------------------------------------------


@task("noop")
def noop() -> None:
    """Do nothing (for testing schedules and the cluster)."""
    return None


# --- sleep ----------------------------------------------------------------------------------------


def _check_sleep(seconds: Any) -> None:
    if not _is_number(seconds) or not math.isfinite(seconds):
        raise _Refused("seconds", f"seconds must be a number, got {seconds!r}")
    if not 0 <= seconds <= MAX_SLEEP_S:
        raise _Refused("seconds", f"seconds must be between 0 and {MAX_SLEEP_S}, got {seconds!r}")


@task(
    "sleep",
    takes_context=True,
    validate=_validator("sleep", _check_sleep),
    example={"kwargs": {"seconds": 5}},
)
def sleep(seconds: float, *, context: TaskContext) -> dict[str, Any]:
    """Sleep for a number of seconds, stopping early when the run is cancelled."""
    _at_run_time(_check_sleep, seconds=seconds)
    started = time.monotonic()
    deadline = started + float(seconds)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if context.cancel_event.wait(min(SLEEP_SLICE_S, remaining)):
            slept = round(time.monotonic() - started, 3)
            context.log(f"cancelled after {slept}s of {seconds}s")
            return {"slept": slept, "cancelled": True}
    slept = round(time.monotonic() - started, 3)
    return {"slept": slept, "cancelled": False}


# --- log ------------------------------------------------------------------------------------------


def _check_log(message: Any, level: Any) -> None:
    if not isinstance(message, str):
        raise _Refused("message", f"message must be a string, got {type(message).__name__}")
    if len(message) > MAX_LOG_MESSAGE_CHARS:
        raise _Refused(
            "message",
            f"message is {len(message)} characters; the limit is {MAX_LOG_MESSAGE_CHARS}",
        )
    if not isinstance(level, str) or level not in LOG_LEVELS:
        raise _Refused("level", f"level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")


@task(
    "log",
    takes_context=True,
    validate=_validator("log", _check_log),
    example={"kwargs": {"message": "hello from the scheduler", "level": "info"}},
)
def log(message: str, level: str = "info", *, context: TaskContext) -> None:
    """Write a message to the "jobs.tasks.log" logger and to the run's output."""
    _at_run_time(_check_log, message=message, level=level)
    task_logger.log(
        LOG_LEVELS[level],
        "%s",
        message,
        extra={"job_name": context.job_name, "execution_id": context.execution_id},
    )
    context.log(message)


# --- purge_runs -----------------------------------------------------------------------------------


def _check_purge(older_than_days: Any, batch: Any, max_rows: Any) -> None:
    from jobs.retention import BadPurgeArgument, check_purge_arguments

    try:
        check_purge_arguments(older_than_days, batch, max_rows)
    except BadPurgeArgument as exc:
        raise _Refused(exc.param, str(exc)) from None


@task(
    "purge_runs",
    takes_context=True,
    validate=_validator("purge_runs", _check_purge),
    example={"kwargs": {"older_than_days": 30}},
)
def purge_runs(
    older_than_days: float,
    batch: int = 1_000,
    max_rows: int = 100_000,
    *,
    context: TaskContext,
) -> dict[str, Any]:
    """Delete finished runs older than a number of days (run history retention; see
    ``jobs.retention``): each job's newest run and runs with a notification to send are kept."""
    from jobs import services

    _at_run_time(_check_purge, older_than_days=older_than_days, batch=batch, max_rows=max_rows)
    result = services.runs_purge(
        older_than_days=older_than_days, batch=batch, max_rows=max_rows, by=services.SYSTEM
    )
    context.log(
        f"deleted {result.deleted} runs finished before {result.cutoff.isoformat()}"
        + ("" if result.complete else f" (stopped at max_rows {max_rows}; more remain)")
    )
    return {
        "deleted": result.deleted,
        "cutoff": result.cutoff.isoformat(),
        "complete": result.complete,
    }


# --- http_request ---------------------------------------------------------------------------------


DEFAULT_PORTS = {"http": 80, "https": 443}


def _allowlist_entry(entry: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port or None)."""
    entry = entry.strip().lower()
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:
        host, port = entry, ""
    return host, int(port) if port.isdigit() else None


def _allowed(host: str, port: int) -> bool:
    """Whether (host, port) is on SCHEDULER_HTTP_ALLOWED_HOSTS: an entry with a port allows that
    port only; a bare host allows only the scheme's default port (with ``localhost`` allowed, any
    local service's port used to be reachable, its answer readable in the run's result)."""
    for entry in app_setting("SCHEDULER_HTTP_ALLOWED_HOSTS"):
        if not entry.strip():
            continue
        allowed_host, allowed_port = _allowlist_entry(entry)
        if allowed_host == host and port == allowed_port:
            return True
    return False


def _check_url(url: Any, param: str = "url") -> tuple[str, str]:
    """Return (scheme, hostname) of an allowed URL, or refuse it."""
    if not isinstance(url, str) or not url:
        raise _Refused(param, f"url must be a non-empty string, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as exc:
        raise _Refused(param, f"url {url!r} is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in HTTP_SCHEMES:
        raise _Refused(param, f"url scheme must be http or https, got {parts.scheme!r}")
    host = (parts.hostname or "").lower()
    if not host:
        raise _Refused(param, f"url {url!r} has no host")
    default_port = DEFAULT_PORTS[scheme]
    port = parts.port or default_port
    # A bare host on the list stands for its default port: compare the default as "no port".
    if not _allowed(host, None if port == default_port else port) and not _allowed(host, port):
        shown = host if port == default_port else f"{host}:{port}"
        raise _Refused(param, f"host {shown!r} is not in SCHEDULER_HTTP_ALLOWED_HOSTS")
    return scheme, host


def _has_line_break(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text


def _check_http(
    url: Any,
    method: Any = "GET",
    timeout: Any = 10,
    headers: Any = None,
    body: Any = None,
    expect_status: Any = None,
) -> None:
    _check_url(url)
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise _Refused("method", f"method must be one of {', '.join(HTTP_METHODS)}, got {method!r}")
    max_timeout = app_setting("SCHEDULER_HTTP_MAX_TIMEOUT_S")
    if not _is_number(timeout) or not math.isfinite(timeout):
        raise _Refused("timeout", f"timeout must be a number of seconds, got {timeout!r}")
    if not 0 < timeout <= max_timeout:
        raise _Refused(
            "timeout",
            f"timeout must be > 0 and <= {max_timeout} (SCHEDULER_HTTP_MAX_TIMEOUT_S), "
            f"got {timeout!r}",
        )
    if headers is not None:
        if not isinstance(headers, dict):
            raise _Refused("headers", "headers must be an object of strings")
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise _Refused("headers", f"header {name!r} must map a string to a string")
            if not name or _has_line_break(name) or ":" in name or _has_line_break(value):
                raise _Refused("headers", f"header {name!r} has an invalid name or value")
    if body is not None and not isinstance(body, str):
        raise _Refused("body", f"body must be a string or null, got {type(body).__name__}")
    if expect_status is not None:
        if not isinstance(expect_status, list) or not expect_status:
            raise _Refused("expect_status", "expect_status must be a non-empty list of integers")
        for status in expect_status:
            if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
                raise _Refused("expect_status", f"expect_status has an invalid status {status!r}")


class _AllowlistRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an http(s) URL whose host is on the allowlist."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        try:
            _check_url(newurl)
        except _Refused as exc:
            fp.close()
            raise TaskError(f"redirect ({code}) to {newurl!r} refused: {exc.message}") from None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _opener() -> urllib.request.OpenerDirector:
    """An opener with http(s) handlers only: no file:, ftp: or data: access at all."""
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.ProxyHandler(),
        urllib.request.HTTPHandler(),
        urllib.request.HTTPSHandler(context=ssl.create_default_context()),
        _AllowlistRedirectHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    ):
        opener.add_handler(handler)
    return opener


def _redacted(url: str) -> str:
    """The URL without credentials, query or fragment (safe to write to the output)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


# Sent with every http_request (unless the job sets them itself).
FENCING_TOKEN_HEADER = "X-Scheduler-Fencing-Token"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"


@task(
    "http_request",
    takes_context=True,
    validate=_validator("http_request", _check_http),
    example={"kwargs": {"url": "https://example.com/health", "expect_status": [200]}},
)
def http_request(
    url: str,
    method: str = "GET",
    timeout: float = 10,
    headers: dict[str, str] | None = None,
    body: str | None = None,
    expect_status: list[int] | None = None,
    *,
    context: TaskContext,
) -> dict[str, Any]:
    """Make an HTTP request to an allowlisted host and check the response status."""
    _at_run_time(
        _check_http,
        url=url,
        method=method,
        timeout=timeout,
        headers=headers,
        body=body,
        expect_status=expect_status,
    )
    method = method.upper()
    data = body.encode("utf-8") if body is not None else None
    # The scheme was checked above (http/https only) and the opener has no other handlers.
    # The run's fencing token and idempotency key travel with the request (jobs.fencing): a
    # receiver may refuse a token older than one it has seen, or deduplicate by the key. The
    # job's own headers win.
    sent = {
        FENCING_TOKEN_HEADER: str(context.fencing_token or ""),
        IDEMPOTENCY_KEY_HEADER: context.idempotency_key,
    }
    sent = {name: value for name, value in sent.items() if value}
    sent.update(headers or {})
    request = urllib.request.Request(  # noqa: S310
        url, data=data, headers=sent, method=method
    )
    shown = f"{method} {_redacted(url)}"
    if context.cancelled:
        raise TaskError(f"{shown}: cancelled before the request was sent")
    deadline = time.monotonic() + float(timeout)
    try:
        response = _opener().open(request, timeout=float(timeout))
    except urllib.error.HTTPError as exc:
        response = exc  # a non-2xx status: still a response, judged against expect_status below
    except urllib.error.URLError as exc:
        raise TaskError(f"{shown} failed: {exc.reason}") from exc
    except (TimeoutError, OSError) as exc:
        raise TaskError(f"{shown} failed: {exc}") from exc
    try:
        status = int(getattr(response, "status", None) or response.code)
        charset = response.headers.get_content_charset() or "utf-8"
        preview = bytearray()
        received = 0
        while received < HTTP_MAX_RESPONSE_BYTES:
            if context.cancelled:
                raise TaskError(f"{shown}: cancelled while reading the response")
            if time.monotonic() > deadline:
                raise TaskError(f"{shown}: response not received within {timeout}s")
            try:
                chunk = response.read(min(HTTP_READ_CHUNK, HTTP_MAX_RESPONSE_BYTES - received))
            except (TimeoutError, OSError) as exc:
                raise TaskError(f"{shown}: reading the response failed: {exc}") from exc
            if not chunk:
                break
            received += len(chunk)
            if len(preview) < HTTP_BODY_PREVIEW_BYTES:
                preview += chunk[: HTTP_BODY_PREVIEW_BYTES - len(preview)]
    finally:
        response.close()
    try:
        text = bytes(preview).decode(charset, errors="replace")
    except LookupError:
        text = bytes(preview).decode("utf-8", errors="replace")
    context.log(f"{shown} -> {status} ({received} bytes)")
    ok = status in expect_status if expect_status is not None else 200 <= status < 300
    if not ok:
        wanted = f"one of {expect_status}" if expect_status is not None else "2xx"
        raise HTTPStatusError(status, f"{shown} returned HTTP {status}, expected {wanted}")
    return {"status": status, "bytes": received, "body": text}


# --- management_command ---------------------------------------------------------------------------


def _check_command(command: Any, args: Any = None) -> None:
    if not isinstance(command, str) or not command:
        raise _Refused("command", f"command must be a non-empty string, got {command!r}")
    if command not in app_setting("SCHEDULER_ALLOWED_COMMANDS"):
        raise _Refused("command", f"command {command!r} is not in SCHEDULER_ALLOWED_COMMANDS")
    if command not in get_commands():
        raise _Refused("command", f"command {command!r} is allowed but not installed")
    if args is not None and (
        not isinstance(args, list) or not all(isinstance(arg, str) for arg in args)
    ):
        raise _Refused("args", "args must be a list of strings")


class _LineLog(io.TextIOBase):
    """A text stream that hands each complete line to ``context.log`` as it is written."""

    def __init__(self, context: TaskContext, prefix: str = "") -> None:
        super().__init__()
        self._context = context
        self._prefix = prefix
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._pending += text
        *lines, self._pending = self._pending.split("\n")
        for line in lines:
            self._context.log(f"{self._prefix}{line}")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._context.log(f"{self._prefix}{self._pending}")
            self._pending = ""


@task(
    "management_command",
    takes_context=True,
    validate=_validator("management_command", _check_command),
    example={"kwargs": {"command": "check"}},
)
def management_command(
    command: str, args: list[str] | None = None, *, context: TaskContext
) -> dict[str, Any]:
    """Run an allowlisted Django management command in-process, capturing its output."""
    _at_run_time(_check_command, command=command, args=args)
    stdout = _LineLog(context)
    stderr = _LineLog(context, prefix="[stderr] ")
    try:
        call_command(command, *(args or []), stdout=stdout, stderr=stderr)
    finally:
        stdout.flush()
        stderr.flush()
    return {"command": command, "args": list(args or [])}
