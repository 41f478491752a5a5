"""The built-in tasks: noop, sleep, log, http_request (against a real local server) and
management_command; plus a source check that no task can reach a shell."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import jobs
from jobs.registry import TaskArgumentError, TaskContext, TaskError, get_task, validate_task_call
from jobs.tasks import (
    HTTP_BODY_PREVIEW_BYTES,
    HTTPStatusError,
    http_request,
    log,
    management_command,
    noop,
    sleep,
)


def make_context(**overrides) -> TaskContext:
    values = {"execution_id": 7, "job_name": "job", "attempt": 1, "scheduled_for": None}
    values.update(overrides)
    return TaskContext(**values)


def refusal(name: str, args: list, kwargs: dict) -> TaskArgumentError:
    with pytest.raises(TaskArgumentError) as excinfo:
        validate_task_call(name, args, kwargs)
    return excinfo.value


# --- noop -----------------------------------------------------------------------------------------


def test_noop():
    validate_task_call("noop", [], {})
    assert noop() is None
    assert get_task("noop").func() is None


def test_noop_refuses_arguments():
    assert refusal("noop", [1], {}).field == "args"
    assert refusal("noop", [], {"x": 1}).field == "kwargs"


# --- sleep ----------------------------------------------------------------------------------------


def test_sleep_returns():
    context = make_context()
    started = time.monotonic()
    result = sleep(0.1, context=context)
    elapsed = time.monotonic() - started
    assert result["cancelled"] is False
    assert 0.1 <= elapsed < 2
    assert result["slept"] >= 0.09


def test_sleep_zero():
    assert sleep(0, context=make_context())["cancelled"] is False


def test_sleep_accepts_positional_and_keyword():
    validate_task_call("sleep", [2], {})
    validate_task_call("sleep", [], {"seconds": 2.5})
    validate_task_call("sleep", [86400], {})


def test_sleep_is_cancellable():
    context = make_context()
    timer = threading.Timer(0.2, context.cancel_event.set)
    timer.start()
    started = time.monotonic()
    try:
        result = sleep(30, context=context)
    finally:
        timer.cancel()
    elapsed = time.monotonic() - started
    assert result["cancelled"] is True
    assert elapsed < 3
    assert 0.1 <= result["slept"] < 3
    assert "cancelled" in context.output


@pytest.mark.parametrize("seconds", [-1, 86401, "5", True, None, [1]])
def test_sleep_refuses_bad_seconds(seconds):
    error = refusal("sleep", [seconds], {})
    assert error.field == "args"
    assert "seconds" in error.message
    assert refusal("sleep", [], {"seconds": seconds}).field == "kwargs"


def test_sleep_refuses_missing_and_extra_arguments():
    assert "seconds" in refusal("sleep", [], {}).message
    assert refusal("sleep", [1, 2], {}).field == "args"
    assert "'minutes'" in refusal("sleep", [], {"seconds": 1, "minutes": 1}).message


def test_sleep_checks_again_at_run_time():
    with pytest.raises(TaskArgumentError):
        sleep(-1, context=make_context())


# --- log ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "levelno"),
    [
        ("debug", logging.DEBUG),
        ("info", logging.INFO),
        ("warning", logging.WARNING),
        ("error", logging.ERROR),
    ],
)
def test_log_writes_to_logger_and_output(caplog, level, levelno):
    caplog.set_level(logging.DEBUG, logger="jobs.tasks.log")
    context = make_context(job_name="nightly")
    validate_task_call("log", ["hello there"], {"level": level})
    assert log("hello there", level, context=context) is None
    records = [r for r in caplog.records if r.name == "jobs.tasks.log"]
    assert len(records) == 1
    assert records[0].levelno == levelno
    assert records[0].getMessage() == "hello there"
    assert records[0].job_name == "nightly"
    assert context.output == "hello there\n"


def test_log_default_level_is_info(caplog):
    caplog.set_level(logging.DEBUG, logger="jobs.tasks.log")
    log("x", context=make_context())
    assert [r.levelno for r in caplog.records if r.name == "jobs.tasks.log"] == [logging.INFO]


def test_log_validation():
    validate_task_call("log", [], {"message": "m" * 10_000})
    assert refusal("log", [], {"message": "m" * 10_001}).field == "kwargs"
    assert "level" in refusal("log", ["m"], {"level": "verbose"}).message
    assert refusal("log", ["m", "INFO"], {}).field == "args"
    assert "message" in refusal("log", [42], {}).message
    assert "message" in refusal("log", [], {}).message


def test_log_checks_again_at_run_time():
    with pytest.raises(TaskArgumentError):
        log("x", "loud", context=make_context())


# --- http_request ---------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, dict, bytes]]

    def log_message(self, format, *args):  # keep the test output quiet
        pass

    def _record(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        return body

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _handle(self) -> None:
        body = self._record()
        if self.path == "/ok":
            self._send(200, b"hello")
        elif self.path == "/echo":
            text = f"{self.command} {self.headers.get('X-Test', '')} {body.decode()}"
            self._send(201, text.encode())
        elif self.path == "/big":
            self._send(200, b"a" * 10_000)
        elif self.path == "/missing":
            self._send(404, b"not here")
        elif self.path == "/error":
            self._send(500, b"boom")
        elif self.path == "/redirect-away":
            self._send(302, headers={"Location": "http://not-allowed.example/steal"})
        elif self.path == "/redirect-ftp":
            self._send(302, headers={"Location": "ftp://127.0.0.1/file"})
        elif self.path.startswith("/redirect-port?to="):
            port = self.path.split("=", 1)[1]
            self._send(302, headers={"Location": f"http://127.0.0.1:{port}/ok"})
        elif self.path == "/redirect-local":
            self._send(302, headers={"Location": "/ok"})
        elif self.path == "/slow":
            time.sleep(1.5)
            self._send(200, b"late")
        else:
            self._send(404)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False


@pytest.fixture
def http_server(settings, monkeypatch) -> Iterator[_Server]:
    for name in (
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)
    settings.SCHEDULER_HTTP_MAX_TIMEOUT_S = 30
    server = _Server(("127.0.0.1", 0), _Handler)
    # This server's port only: a bare host allows just the default port.
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = [f"127.0.0.1:{server.server_address[1]}"]
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def url_for(server: _Server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


def test_http_success(http_server):
    url = url_for(http_server, "/ok")
    validate_task_call("http_request", [url], {})
    context = make_context()
    result = http_request(url, context=context)
    assert result == {"status": 200, "bytes": 5, "body": "hello"}
    assert [(m, p) for m, p, _, _ in http_server.requests] == [("GET", "/ok")]
    assert "GET" in context.output and "200" in context.output


def test_http_post_with_headers_and_body(http_server):
    url = url_for(http_server, "/echo")
    kwargs = {
        "url": url,
        "method": "post",
        "headers": {"X-Test": "yes"},
        "body": "payload",
        "expect_status": [201],
    }
    validate_task_call("http_request", [], kwargs)
    result = http_request(**kwargs, context=make_context())
    assert result["status"] == 201
    assert result["body"] == "POST yes payload"


def test_http_sends_the_runs_fencing_token_and_idempotency_key(http_server):
    url = url_for(http_server, "/ok")
    context = make_context(fencing_token=41, idempotency_key="3:2026-12-06T12:00:00+00:00:1")
    http_request(url, context=context)
    sent = http_server.requests[-1][2]
    assert sent["X-Scheduler-Fencing-Token"] == "41"
    assert sent["Idempotency-Key"] == "3:2026-12-06T12:00:00+00:00:1"
    # The job's own headers win; a context without a token sends none.
    http_request(url, headers={"Idempotency-Key": "mine"}, context=context)
    assert http_server.requests[-1][2]["Idempotency-Key"] == "mine"
    http_request(url, context=make_context())
    assert "X-Scheduler-Fencing-Token" not in http_server.requests[-1][2]


def test_http_head(http_server):
    result = http_request(url_for(http_server, "/ok"), "HEAD", context=make_context())
    assert result == {"status": 200, "bytes": 0, "body": ""}


def test_http_body_preview_is_bounded(http_server):
    result = http_request(url_for(http_server, "/big"), context=make_context())
    assert result["bytes"] == 10_000
    assert result["body"] == "a" * HTTP_BODY_PREVIEW_BYTES


@pytest.mark.parametrize(("path", "status"), [("/missing", 404), ("/error", 500)])
def test_http_non_2xx_raises(http_server, path, status):
    with pytest.raises(HTTPStatusError) as excinfo:
        http_request(url_for(http_server, path), context=make_context())
    assert isinstance(excinfo.value, TaskError)
    assert excinfo.value.status == status
    assert str(status) in str(excinfo.value)


def test_http_expect_status(http_server):
    result = http_request(
        url_for(http_server, "/missing"), expect_status=[404], context=make_context()
    )
    assert result["status"] == 404
    assert result["body"] == "not here"
    with pytest.raises(HTTPStatusError):
        http_request(url_for(http_server, "/ok"), expect_status=[204], context=make_context())


def test_http_host_not_allowed_at_validate(http_server):
    error = refusal("http_request", [], {"url": "http://example.com/x"})
    assert error.field == "kwargs"
    assert error.message == "host 'example.com' is not in SCHEDULER_HTTP_ALLOWED_HOSTS"
    assert refusal("http_request", ["http://localhost:1/"], {}).field == "args"


def test_http_host_not_allowed_at_run_time(http_server, settings):
    url = url_for(http_server, "/ok")
    validate_task_call("http_request", [url], {})
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["other.example"]
    with pytest.raises(TaskArgumentError, match="not in SCHEDULER_HTTP_ALLOWED_HOSTS"):
        http_request(url, context=make_context())
    assert http_server.requests == []


def test_http_allowlist_is_exact_and_case_insensitive(settings):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["API.Example.com"]
    validate_task_call("http_request", ["https://api.example.COM/path"], {})
    for url in ("https://example.com/", "https://evil.api.example.com/", "https://api.example.co/"):
        assert "not in SCHEDULER_HTTP_ALLOWED_HOSTS" in refusal("http_request", [url], {}).message


@pytest.mark.parametrize(
    ("allowed", "url", "ok"),
    [
        ("localhost", "http://localhost/", True),
        ("localhost", "https://localhost/", True),
        ("localhost", "http://localhost:6379/", False),  # another local service: refused
        ("localhost", "https://localhost:80/", False),
        ("localhost:8080", "http://localhost:8080/x", True),
        ("localhost:8080", "http://localhost/", False),
        ("localhost:8080", "http://localhost:8081/", False),
        ("api.example.com:443", "https://api.example.com/", True),
        ("[::1]:8080", "http://[::1]:8080/", True),
        ("[::1]", "http://[::1]:8080/", False),
    ],
)
def test_http_allowlist_entries_are_host_and_port(settings, allowed, url, ok):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = [allowed]
    if ok:
        validate_task_call("http_request", [url], {})
    else:
        assert "not in SCHEDULER_HTTP_ALLOWED_HOSTS" in refusal("http_request", [url], {}).message


def test_http_redirect_to_another_port_of_an_allowed_host_refused(http_server, settings):
    port = http_server.server_address[1]
    with pytest.raises(TaskError, match="refused"):
        http_request(url_for(http_server, f"/redirect-port?to={port + 1}"), context=make_context())


def test_http_empty_allowlist_refuses_everything(settings):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = []
    refusal("http_request", ["http://127.0.0.1/"], {})


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/file", "file:///etc/passwd", "127.0.0.1/ok", "", "http:///nohost"]
)
def test_http_bad_url_refused(http_server, url):
    refusal("http_request", [url], {})
    with pytest.raises(TaskArgumentError):
        http_request(url, context=make_context())


def test_http_ftp_scheme_message(http_server):
    assert "http or https" in refusal("http_request", ["ftp://127.0.0.1/x"], {}).message


def test_http_timeout_bounds(http_server, settings):
    url = url_for(http_server, "/ok")
    settings.SCHEDULER_HTTP_MAX_TIMEOUT_S = 5
    validate_task_call("http_request", [url], {"timeout": 5})
    validate_task_call("http_request", [url], {"timeout": 0.5})
    for timeout in (0, -1, 5.01, 60, "10", True, None):
        error = refusal("http_request", [url], {"timeout": timeout})
        assert error.field == "kwargs"
        assert "timeout" in error.message
    # The default timeout (10 s) is over this maximum: refused too.
    refusal("http_request", [url], {})
    with pytest.raises(TaskArgumentError, match="timeout"):
        http_request(url, timeout=6, context=make_context())


def test_http_timeout_enforced(http_server):
    started = time.monotonic()
    with pytest.raises(TaskError):
        http_request(url_for(http_server, "/slow"), timeout=0.3, context=make_context())
    assert time.monotonic() - started < 1.4


def test_http_method_and_other_arguments_validated(http_server):
    url = url_for(http_server, "/ok")
    assert "method" in refusal("http_request", [url, "TRACE"], {}).message
    assert "header" in refusal("http_request", [url], {"headers": {"X": "a\r\nB: c"}}).message
    assert "header" in refusal("http_request", [url], {"headers": {"X": 1}}).message
    assert "body" in refusal("http_request", [url], {"body": {"a": 1}}).message
    assert "expect_status" in refusal("http_request", [url], {"expect_status": [99]}).message
    assert "expect_status" in refusal("http_request", [url], {"expect_status": 200}).message
    assert "'bogus'" in refusal("http_request", [url], {"bogus": 1}).message


def test_http_redirect_to_other_host_refused(http_server):
    with pytest.raises(TaskError, match=r"not-allowed\.example"):
        http_request(url_for(http_server, "/redirect-away"), context=make_context())
    assert [p for _, p, _, _ in http_server.requests] == ["/redirect-away"]


def test_http_redirect_to_other_scheme_refused(http_server):
    with pytest.raises(TaskError, match="refused"):
        http_request(url_for(http_server, "/redirect-ftp"), context=make_context())


def test_http_redirect_to_allowed_host_followed(http_server):
    result = http_request(url_for(http_server, "/redirect-local"), context=make_context())
    assert result["status"] == 200
    assert result["body"] == "hello"


def test_http_connection_refused_is_task_error(http_server, settings):
    settings.SCHEDULER_HTTP_ALLOWED_HOSTS = ["127.0.0.1:1"]
    with pytest.raises(TaskError, match="failed"):
        http_request("http://127.0.0.1:1/", timeout=2, context=make_context())


def test_http_cancelled_before_request(http_server):
    context = make_context()
    context.cancel_event.set()
    with pytest.raises(TaskError, match="cancelled"):
        http_request(url_for(http_server, "/ok"), context=context)
    assert http_server.requests == []


# --- management_command ---------------------------------------------------------------------------


def test_management_command_allowed(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    validate_task_call("management_command", ["check"], {})
    validate_task_call("management_command", [], {"command": "check", "args": ["--tag", "models"]})
    context = make_context()
    result = management_command("check", context=context)
    assert result["command"] == "check"
    assert "System check identified" in context.output


def test_management_command_with_args(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    context = make_context()
    management_command("check", ["--tag", "models"], context=context)
    assert "System check identified" in context.output


def test_management_command_not_allowed_at_validate(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    error = refusal("management_command", [], {"command": "flush"})
    assert error.field == "kwargs"
    assert "SCHEDULER_ALLOWED_COMMANDS" in error.message
    assert refusal("management_command", ["migrate"], {}).field == "args"


def test_management_command_empty_allowlist(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = []
    refusal("management_command", ["check"], {})


def test_management_command_not_allowed_at_run_time(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    validate_task_call("management_command", ["check"], {})
    settings.SCHEDULER_ALLOWED_COMMANDS = []
    context = make_context()
    with pytest.raises(TaskArgumentError, match="SCHEDULER_ALLOWED_COMMANDS"):
        management_command("check", context=context)
    assert context.output == ""


def test_management_command_allowed_but_not_installed(settings):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["no_such_command"]
    assert "not installed" in refusal("management_command", ["no_such_command"], {}).message


@pytest.mark.parametrize("args", ["--deploy", [1], ["--tag", None], {"tag": "models"}])
def test_management_command_args_must_be_list_of_strings(settings, args):
    settings.SCHEDULER_ALLOWED_COMMANDS = ["check"]
    error = refusal("management_command", ["check"], {"args": args})
    assert "list of strings" in error.message
    assert error.field == "kwargs"
    with pytest.raises(TaskArgumentError, match="list of strings"):
        management_command("check", args, context=make_context())


# --- no shell, no unsafe deserialisation ----------------------------------------------------------


@pytest.mark.parametrize("filename", ["tasks.py", "registry.py"])
def test_sources_never_reach_a_shell(filename):
    source = (Path(jobs.__file__).parent / filename).read_text()
    for forbidden in ("subprocess", "os.system", "shell=True", "pickle"):
        assert forbidden not in source, f"{filename} mentions {forbidden!r}"
