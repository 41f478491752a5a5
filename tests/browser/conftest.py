"""Browser tests: Debian's Chromium driven by Playwright against a real daphne and real nodes.

- pytest-playwright is pointed at /usr/bin/chromium (``browser_type_launch_args``).
- Playwright's sync API marks an asyncio loop as running in the main thread for as long as it lives,
  which makes Django's ORM refuse to run (SynchronousOnlyOperation) and ``async_to_sync`` refuse to
  start. So Playwright, the browser and DJANGO_ALLOW_ASYNC_UNSAFE are scoped to this package: they
  end when the last browser test has run, and the rest of a full test session is not affected.
- ``daphne_server``: one ``python -m daphne`` process for the session, against the test database
  (tests commit their data: ``django_db(transaction=True)``), stopped by PID.
- ``cluster``: real ``runnode`` processes per test (tests.cluster.harness), stopped before the
  test database is flushed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    BrowserType,
    ConsoleMessage,
    Page,
    Playwright,
    sync_playwright,
)
from playwright.sync_api import Error as PlaywrightError

from chaos.redis_server import free_port
from tests.cluster.harness import ROOT, Cluster, child_database_url, current_leader, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SECRET_KEY = "browser-test-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz"
PASSWORD = "pw-For-tests-1"  # what tests/conftest.py's make_user sets
DAPHNE_START_TIMEOUT_S = 60.0
DAPHNE_STOP_TIMEOUT_S = 10.0
LEADER_TIMEOUT_S = 40.0
# Generous for a loaded 2-core machine: heartbeat 0.3 s, a node is dead after 3 s without one.
NODE_ARGS = ["--heartbeat-s", "0.3", "--dead-after-s", "3", "--grace", "3"]
VIEWPORT = {"width": 1280, "height": 900}


# --- Playwright, scoped to this package ------------------------------------------------------------


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="package", autouse=True)
def _allow_orm_beside_playwright() -> Iterator[None]:
    """Set before Playwright starts (autouse runs first in its scope), restored after it stops."""
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    yield
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="package")
def playwright(_allow_orm_beside_playwright: None) -> Iterator[Playwright]:
    pw = sync_playwright().start()
    yield pw
    pw.stop()


@pytest.fixture(scope="package")
def browser_type(playwright: Playwright, browser_name: str | None) -> BrowserType:
    return getattr(playwright, browser_name or "chromium")


@pytest.fixture(scope="package")
def launch_browser(
    browser_type_launch_args: dict[str, Any], browser_type: BrowserType
) -> Callable[..., Browser]:
    def launch(**kwargs: Any) -> Browser:
        return browser_type.launch(**{**browser_type_launch_args, **kwargs})

    return launch


@pytest.fixture(scope="package")
def browser(launch_browser: Callable[..., Browser]) -> Iterator[Browser]:
    browser = launch_browser()
    yield browser
    browser.close()


@pytest.fixture(scope="package")
def browser_context_args(daphne_server: str) -> dict[str, Any]:
    return {"base_url": daphne_server, "viewport": VIEWPORT}


# --- daphne ----------------------------------------------------------------------------------------


def _child_env(var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    env.pop("REDIS_URL", None)
    env.update(
        {
            "DATABASE_URL": child_database_url(),
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
            "DJANGO_SECRET_KEY": SECRET_KEY,
            "SCHEDULER_VAR_DIR": str(var_dir),
            "SCHEDULER_TASK_MODULES": "tests.cluster.tasks",
            "SCHEDULER_LIVE_POLL_S": "0.05",
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def daphne_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m daphne`` on a free loopback port against the test database; its base URL."""
    workdir = tmp_path_factory.mktemp("daphne")
    port = free_port()
    log_path = workdir / "daphne.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "scheduler_project.asgi:application",
            ],
            cwd=ROOT,
            env=_child_env(workdir / "var"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DAPHNE_START_TIMEOUT_S
        while not _http_ok(f"{base}/health/live"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daphne did not start:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.1)
        yield base
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=DAPHNE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=5)


# --- nodes -----------------------------------------------------------------------------------------


class BrowserCluster(Cluster):
    def start_nodes(self, count: int) -> tuple[str, int]:
        """Start ``count`` nodes n0..; (leader node id, term) once one of them leads."""
        for index in range(count):
            self.start(f"n{index}")
        try:
            return wait_for(current_leader, LEADER_TIMEOUT_S, interval=0.1)
        except AssertionError:
            raise AssertionError(f"no leader elected\n{self.logs()}") from None


@pytest.fixture
def cluster(transactional_db: None, daphne_server: str, tmp_path: Path) -> Iterator[BrowserCluster]:
    """Nodes for one test (coordination "database"); stopped before the database is flushed."""
    nodes = BrowserCluster(tmp_path, coordination="database", default_args=NODE_ARGS)
    yield nodes
    nodes.close()


# --- pages -----------------------------------------------------------------------------------------


@dataclass
class ConsoleLog:
    """Console errors and uncaught exceptions of the pages it watches."""

    errors: list[str] = field(default_factory=list)

    def watch(self, page: Page) -> Page:
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        return page

    def _on_console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        url = (message.location or {}).get("url", "")
        text = message.text
        # The job editor asks the server to check a cron while typing: a bad one is answered with
        # 400, which Chromium logs as a failed resource. That is the expected answer, not a JS error.
        if "/api/schedule-preview/" in url and "status of 400" in text:
            return
        self.errors.append(f"console.error: {text} ({url})")

    def assert_clean(self) -> None:
        assert not self.errors, "browser console errors:\n" + "\n".join(self.errors)


@pytest.fixture
def console(page: Page) -> ConsoleLog:
    log = ConsoleLog()
    log.watch(page)
    page.set_default_timeout(20_000)
    return log


@pytest.fixture
def page_with(
    browser: Browser, daphne_server: str
) -> Iterator[Callable[..., tuple[Page, ConsoleLog]]]:
    """A page in a context of its own (a viewport, a time zone, a colour scheme: Playwright's
    new_context options) on the test server, with its console watched; closed after the test."""
    contexts: list[BrowserContext] = []

    def open_page(**options: Any) -> tuple[Page, ConsoleLog]:
        context = browser.new_context(base_url=daphne_server, **options)
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(20_000)
        log = ConsoleLog()
        log.watch(page)
        return page, log

    yield open_page
    for context in contexts:
        context.close()


def login(page: Page, username: str, password: str = PASSWORD) -> None:
    """Sign in through the real /login/ page and land on the overview."""
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert urlsplit(page.url).path == "/", f"login did not reach the overview: {page.url}"
    wait_live(page)


def wait_live(page: Page, timeout_ms: float = 20_000) -> None:
    """The page's WebSocket is open (the header's indicator says Live)."""
    try:
        page.wait_for_selector('#live-indicator[data-state="live"]', timeout=timeout_ms)
    except PlaywrightError as exc:
        state = page.get_attribute("#live-indicator", "data-state")
        raise AssertionError(f"the live feed did not connect (state {state})") from exc
