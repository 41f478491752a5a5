"""W5 live (docs/benchmarks.md): a state change committed -> the dashboard's WebSocket frame that carries it,
p50/p95, with 1 and with 100 dashboards open. A measurement, not a test.

    python -m bench.w5_live                          # SQLite in a temp dir, 200 commits per phase
    python -m bench.w5_live --database-url mysql://root@127.0.0.1:3306/sched_w5   # (re)created
    python -m bench.w5_live --commits 100 --no-browser
    python -m bench.w5_live --redis-url redis://127.0.0.1:6379/15   # with the doorbell (below)

Without ``--redis-url`` the web process polls the database every SCHEDULER_LIVE_POLL_S while
dashboards are connected; with it, the cluster coordinates through Redis and the live feed polls
when the doorbell rings (every commit here rings after it, as nodes and the API do), and otherwise
every SCHEDULER_LIVE_IDLE_POLL_S. Each phase also reports what the idle web process costs the
database: its live feed's queries per second over IDLE_WINDOW_S with the dashboards connected and
nothing changing (the counters of /metrics).

What it does: a private ``daphne`` (SCHEDULER_LIVE_POLL_S, default 0.05 s) on a free loopback port
against a freshly migrated database; a viewer created with ``manage.py createuser`` and signed in
through /login/; then N WebSocket connections to /ws/dashboard/ with that session cookie and an
Origin header (a minimal RFC 6455 client on asyncio streams, so nothing extra to install). In a loop
this process changes one execution's status (and its ``reason`` to a sequence number) with one
autocommitted UPDATE, stamps ``time.time()`` right after the commit returns, and every connection
stamps ``time.time()`` when the complete ``executions`` frame carrying that sequence number has been
read. The next commit waits until every connection has it (bounded), then a random 20-80 ms, so
commits fall at random points of the poll cycle.

With 100 dashboards, one real Chromium page (Playwright, /usr/bin/chromium) is open too: an init
script wraps the page's WebSocket and, in a ``message`` listener that runs before the page's own
handler, takes ``performance.timeOrigin + performance.now()`` (and ``Date.now()`` as a cross-check).
Same machine, same clock: latency = receipt - commit stamp.

Everything stays on loopback, every wait is bounded, and every process started here is stopped
here by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.cookiejar
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SECRET = "bench-w5-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFG"
USERNAME = "w5-viewer"
PASSWORD = "w5-Bench-password-1"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
START_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 30.0
FRAME_TIMEOUT_S = 5.0  # one commit's frame must reach every dashboard within this
WARMUP_COMMITS = 10
TOTAL_TIMEOUT_S = 900.0
IDLE_WINDOW_S = 10.0
METRICS_TOKEN = "w5-metrics-token"
REASON_PREFIX = "w5-"

# In the page: time every frame that carries one of our commits when it arrives.
BROWSER_PROBE = """
(() => {
  const Native = window.WebSocket;
  const seen = (window.__w5 = []);
  function Probe(url, protocols) {
    const ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
    ws.addEventListener("message", (event) => {
      const precise = performance.timeOrigin + performance.now();
      const wall = Date.now();
      if (typeof event.data !== "string" || event.data.indexOf('"__PREFIX__') < 0) return;
      const message = JSON.parse(event.data);
      if (message.type !== "executions") return;
      for (const row of message.data) {
        if (typeof row.reason === "string" && row.reason.startsWith("__PREFIX__")) {
          seen.push([Number(row.reason.slice(__CUT__)), precise, wall]);
        }
      }
    });
    return ws;
  }
  Probe.prototype = Native.prototype;
  for (const name of ["CONNECTING", "OPEN", "CLOSING", "CLOSED"]) Probe[name] = Native[name];
  window.WebSocket = Probe;
})();
""".replace("__PREFIX__", REASON_PREFIX).replace("__CUT__", str(len(REASON_PREFIX)))


# --- small utilities --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))]


# --- the server -------------------------------------------------------------------------------------


class Server:
    """A fresh database, migrated, with one viewer; a daphne process serving it."""

    def __init__(
        self, database_url: str | None, poll_s: float, workdir: Path, redis_url: str | None = None
    ) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.created_mysql: dict[str, Any] | None = None
        self.database_url = database_url or f"sqlite:///{workdir / 'w5.sqlite3'}"
        self.poll_s = poll_s
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "REDLOCK_URLS"}},
            "DATABASE_URL": self.database_url,
            "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
            "DJANGO_SECRET_KEY": SECRET,
            "SCHEDULER_VAR_DIR": str(workdir / "var"),
            "SCHEDULER_LIVE_POLL_S": str(poll_s),
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
            "SCHEDULER_METRICS_TOKEN": METRICS_TOKEN,
        }
        if redis_url:
            self.env["REDIS_URL"] = redis_url
            self.env["SCHEDULER_REDIS_PREFIX"] = f"w5x{os.getpid()}"
        self.process: subprocess.Popen | None = None
        self._log: Any = None

    def prepare(self) -> None:
        if self.database_url.startswith("mysql"):
            self._recreate_mysql()
        manage = [sys.executable, "manage.py"]
        subprocess.run(
            [*manage, "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            check=True,
            timeout=300,
        )
        subprocess.run(
            [*manage, "createuser", USERNAME, "--role", "viewer", "--password", PASSWORD],
            cwd=ROOT,
            env=self.env,
            check=True,
            timeout=120,
            stdout=subprocess.DEVNULL,
        )
        # This process writes the commits: Django against the same database.
        os.environ.update({k: self.env[k] for k in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")})
        os.environ.update({k: self.env[k] for k in ("DJANGO_SECRET_KEY", "SCHEDULER_VAR_DIR")})
        for key in ("REDIS_URL", "SCHEDULER_REDIS_PREFIX"):
            if key in self.env:
                os.environ[key] = self.env[key]
        import django

        django.setup()

    def _recreate_mysql(self) -> None:
        import dj_database_url
        import MySQLdb

        cfg = dj_database_url.parse(self.database_url)
        self.created_mysql = cfg
        conn = MySQLdb.connect(
            host=cfg["HOST"] or "127.0.0.1",
            port=int(cfg["PORT"] or 3306),
            user=cfg["USER"],
            passwd=cfg["PASSWORD"] or "",
        )
        try:
            cursor = conn.cursor()
            cursor.execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
            cursor.execute(
                f"CREATE DATABASE `{cfg['NAME']}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
        finally:
            conn.close()

    def start(self) -> None:
        self._log = open(self.workdir / "daphne.log", "wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "scheduler_project.asgi:application",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.base}/health/live", timeout=2) as response:
                    if response.status == 200:
                        return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("daphne did not start; see " + str(self.workdir / "daphne.log"))
            time.sleep(0.1)

    def login(self) -> str:
        """Sign in through /login/ like a browser; the session cookie's value."""
        jar = http.cookiejar.CookieJar()
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        with opener.open(f"{self.base}/login/", timeout=10) as response:
            page = response.read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if token is None:
            raise RuntimeError("no CSRF token on /login/")
        body = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": token.group(1), "username": USERNAME, "password": PASSWORD}
        ).encode()
        request = urllib.request.Request(
            f"{self.base}/login/", data=body, headers={"Referer": f"{self.base}/login/"}
        )
        with opener.open(request, timeout=10):
            pass
        session = next((c.value for c in jar if c.name == "sessionid"), None)
        if not session:
            raise RuntimeError("login failed: no session cookie")
        return session

    def live_counters(self) -> tuple[float, float]:
        """(polls, queries) of the web process's live feed so far, from /metrics."""
        request = urllib.request.Request(
            f"{self.base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        found = dict(
            re.findall(r"^(scheduler_live_(?:polls|queries)_total) ([0-9.e+]+)$", text, re.M)
        )
        return (
            float(found["scheduler_live_polls_total"]),
            float(found["scheduler_live_queries_total"]),
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
        if self.created_mysql is not None:
            from django.db import connections

            connections.close_all()
            self._drop_mysql()

    def _drop_mysql(self) -> None:
        import MySQLdb

        cfg = self.created_mysql
        assert cfg is not None
        conn = MySQLdb.connect(
            host=cfg["HOST"] or "127.0.0.1",
            port=int(cfg["PORT"] or 3306),
            user=cfg["USER"],
            passwd=cfg["PASSWORD"] or "",
        )
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{cfg['NAME']}`")
        finally:
            conn.close()


# --- a minimal RFC 6455 client ------------------------------------------------------------------------


class WebSocketClient:
    """Just enough WebSocket for a dashboard: handshake, read text frames, answer pings, close."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, port: int, path: str, *, cookie: str, origin: str) -> WebSocketClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {path} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\n"
            "Connection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            f"Origin: {origin}\r\n"
            f"Cookie: {cookie}\r\n"
            "\r\n"
        )
        writer.write(request.encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            writer.close()
            raise RuntimeError(f"WebSocket handshake refused: {head.splitlines()[0]!r}")
        return cls(reader, writer)

    async def _send(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        length = len(payload)
        if length < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | length)
        elif length < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, length)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(header + mask + masked)
        await self.writer.drain()

    async def receive(self) -> tuple[bytes, float] | None:
        """The next complete text message and when its last byte was read; None once closed."""
        parts: list[bytes] = []
        while True:
            first, second = await self.reader.readexactly(2)
            opcode, length = first & 0x0F, second & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
            mask = await self.reader.readexactly(4) if second & 0x80 else None
            payload = await self.reader.readexactly(length)
            received = time.time()
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x8:  # close
                return None
            if opcode == 0x9:  # ping
                await self._send(0xA, payload)
                continue
            if opcode == 0xA:  # pong
                continue
            parts.append(payload)
            if first & 0x80:  # FIN
                return b"".join(parts), received

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._send(0x8, struct.pack("!H", 1000))
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 2)


# --- the measurement --------------------------------------------------------------------------------


@dataclass
class Dashboard:
    client: WebSocketClient
    received: dict[int, float] = field(default_factory=dict)
    task: asyncio.Task | None = None


class Phase:
    def __init__(self, server: Server, execution_id: int, job_id: int, session: str) -> None:
        self.server = server
        self.execution_id = execution_id
        self.job_id = job_id
        self.session = session
        self.dashboards: list[Dashboard] = []
        self.commits: dict[int, float] = {}
        self.waiters: dict[int, asyncio.Event] = {}
        self.sequence = 0

    async def open(self, count: int) -> None:
        origin = self.server.base
        cookie = f"sessionid={self.session}"

        async def one() -> Dashboard:
            client = await WebSocketClient.connect(
                self.server.port, "/ws/dashboard/", cookie=cookie, origin=origin
            )
            message = await asyncio.wait_for(client.receive(), CONNECT_TIMEOUT_S)
            if message is None or b'"hello"' not in message[0]:
                raise RuntimeError(f"no hello from the dashboard socket: {message!r}")
            return Dashboard(client)

        for start in range(0, count, 20):  # a browser-like trickle, not one burst of 100
            batch = await asyncio.wait_for(
                asyncio.gather(*(one() for _ in range(min(20, count - start)))),
                CONNECT_TIMEOUT_S,
            )
            self.dashboards.extend(batch)
        for dashboard in self.dashboards:
            dashboard.task = asyncio.create_task(self._read(dashboard))

    async def _read(self, dashboard: Dashboard) -> None:
        needle = f'"{REASON_PREFIX}'.encode()
        while True:
            message = await dashboard.client.receive()
            if message is None:
                return
            payload, received = message
            if b'"type":"executions"' not in payload or needle not in payload:
                continue
            for row in json.loads(payload)["data"]:
                reason = row.get("reason") or ""
                if row["id"] == self.execution_id and reason.startswith(REASON_PREFIX):
                    number = int(reason[len(REASON_PREFIX) :])
                    dashboard.received.setdefault(number, received)
                    event = self.waiters.get(number)
                    if event is not None and all(number in d.received for d in self.dashboards):
                        event.set()

    def _commit(self, number: int) -> float:
        from django.db import transaction

        from jobs.executions import announce
        from jobs.models import JobExecution

        status = "running" if number % 2 else "pending"
        with transaction.atomic():
            JobExecution.objects.filter(pk=self.execution_id).update(
                status=status, reason=f"{REASON_PREFIX}{number}"
            )
            # As every writer of an execution does: the doorbell rings once this commits.
            announce(execution_id=self.execution_id, job_id=self.job_id, status=status)
        return time.time()  # committed, and the ring (if any) handed to its thread

    async def run(self, commits: int) -> tuple[list[int], int]:
        """Warm-up, then ``commits`` measured commits; (the measured numbers, timeouts)."""
        loop = asyncio.get_running_loop()
        measured: list[int] = []
        timeouts = 0
        for index in range(WARMUP_COMMITS + commits):
            self.sequence += 1
            number = self.sequence
            event = self.waiters[number] = asyncio.Event()
            self.commits[number] = await loop.run_in_executor(None, self._commit, number)
            try:
                await asyncio.wait_for(event.wait(), FRAME_TIMEOUT_S)
            except TimeoutError:
                timeouts += 1
            del self.waiters[number]
            if index >= WARMUP_COMMITS:
                measured.append(number)
            await asyncio.sleep(random.uniform(0.02, 0.08))
        return measured, timeouts

    def latencies(self, numbers: list[int]) -> tuple[list[float], list[float], int]:
        """(every frame's latency, per commit the latency of the last dashboard, frames missing)."""
        every: list[float] = []
        slowest: list[float] = []
        missing = 0
        for number in numbers:
            sent = self.commits[number]
            got = [d.received[number] - sent for d in self.dashboards if number in d.received]
            missing += len(self.dashboards) - len(got)
            every.extend(ms * 1000 for ms in got)
            if len(got) == len(self.dashboards):
                slowest.append(max(got) * 1000)
        return every, slowest, missing

    async def close(self) -> None:
        for dashboard in self.dashboards:
            if dashboard.task is not None:
                dashboard.task.cancel()
            await dashboard.client.close()


async def open_browser(server: Server, session: str) -> tuple[Any, Any, Any]:
    from playwright.async_api import async_playwright

    playwright = await async_playwright().start()
    browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    await context.add_cookies([{"name": "sessionid", "value": session, "url": server.base}])
    await context.add_init_script(BROWSER_PROBE)
    page = await context.new_page()
    await page.goto(f"{server.base}/")
    await page.wait_for_selector('#live-indicator[data-state="live"]', timeout=30_000)
    return playwright, browser, page


def summary_row(label: str, count: int, values: list[float], missing: int) -> str:
    p50, p95 = percentile(values, 50), percentile(values, 95)
    p99 = percentile(values, 99)
    top = max(values) if values else math.nan
    return (
        f"| {label:<44} | {count:>10} | {len(values):>6} | {p50:>6.1f} | {p95:>6.1f} "
        f"| {p99:>6.1f} | {top:>6.1f} | {missing:>7} |"
    )


def make_execution() -> tuple[int, int]:
    """A paused job and one execution of it on a queue no node serves: only this script changes it."""
    from django.utils import timezone

    from jobs import services
    from jobs.models import JobExecution

    job = services.job_create(
        data={
            "name": "w5-probe",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 0 1 1 *",
            "enabled": False,
        },
        by=services.SYSTEM,
    )
    now = timezone.now()
    execution = JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, trigger="manual", queue="w5-nobody"
    )
    return execution.pk, job.pk


async def idle_cost(server: Server) -> tuple[float, float]:
    """(polls/s, queries/s) of the web process's live feed while nothing changes."""
    loop = asyncio.get_running_loop()
    polls_0, queries_0 = await loop.run_in_executor(None, server.live_counters)
    started = time.monotonic()
    await asyncio.sleep(IDLE_WINDOW_S)
    polls_1, queries_1 = await loop.run_in_executor(None, server.live_counters)
    elapsed = time.monotonic() - started
    return (polls_1 - polls_0) / elapsed, (queries_1 - queries_0) / elapsed


async def measure(
    args: argparse.Namespace, server: Server, session: str, ids: tuple[int, int]
) -> tuple[list[str], list[str]]:
    rows: list[str] = []
    idle: list[str] = []
    for count in args.dashboards:
        phase = Phase(server, *ids, session)
        await phase.open(count)
        browser_parts: tuple[Any, Any, Any] | None = None
        if count >= 100 and not args.no_browser:
            browser_parts = await open_browser(server, session)
        await asyncio.sleep(1.0)  # let the connect bursts settle
        polls_per_s, queries_per_s = await idle_cost(server)
        idle.append(f"| {count:>10} | {polls_per_s:>13.1f} | {queries_per_s:>15.1f} |")
        numbers, timeouts = await phase.run(args.commits)
        every, slowest, missing = phase.latencies(numbers)
        label = "asyncio client" if count == 1 else f"asyncio clients, every frame of {count}"
        rows.append(summary_row(label, count, every, missing))
        if count > 1:
            rows.append(summary_row(f"asyncio clients, last of the {count}", count, slowest, 0))
        if browser_parts is not None:
            playwright, browser, page = browser_parts
            seen = await page.evaluate("() => window.__w5")
            wanted = set(numbers)
            precise: dict[int, float] = {}
            wall: dict[int, float] = {}
            for number, at_precise, at_wall in seen:
                if number in wanted and number not in precise:
                    precise[number] = at_precise / 1000 - phase.commits[number]
                    wall[number] = at_wall / 1000 - phase.commits[number]
            in_page = [v * 1000 for v in precise.values()]
            rows.append(
                summary_row(
                    f"Chromium page (+{count} clients), in-page",
                    count + 1,
                    in_page,
                    len(wanted) - len(precise),
                )
            )
            rows.append(
                summary_row(
                    "  same, Date.now() (ms resolution)",
                    count + 1,
                    [v * 1000 for v in wall.values()],
                    len(wanted) - len(wall),
                )
            )
            await browser.close()
            await playwright.stop()
        if timeouts:
            rows.append(
                f"| ({timeouts} commits not seen by every dashboard within {FRAME_TIMEOUT_S} s)"
            )
        await phase.close()
        await asyncio.sleep(0.5)
    return rows, idle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: SQLite in a temp dir; MySQL is recreated")
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--poll-s", type=float, default=0.05)
    parser.add_argument("--dashboards", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--no-browser", action="store_true")
    parser.add_argument(
        "--redis-url", help="coordinate through this Redis: the live feed's doorbell is on"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="w5-"))
    server = Server(args.database_url, args.poll_s, workdir, redis_url=args.redis_url)
    try:
        server.prepare()
        server.start()
        session = server.login()
        ids = make_execution()
        started = time.monotonic()
        rows, idle = asyncio.run(
            asyncio.wait_for(measure(args, server, session, ids), TOTAL_TIMEOUT_S)
        )
        elapsed = time.monotonic() - started
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    engine = "MySQL/MariaDB" if server.database_url.startswith("mysql") else "SQLite"
    feed = "doorbell (Redis) + idle poll" if args.redis_url else "poll only (no Redis)"
    load = " / ".join(f"{value:.2f}" for value in os.getloadavg())
    print()
    print(
        f"W5 live: commit -> WebSocket frame received. {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs (load {load}), {platform.python_implementation()} "
        f"{platform.python_version()}, {engine}, live feed: {feed}, "
        f"SCHEDULER_LIVE_POLL_S={args.poll_s}, {args.commits} commits per row "
        f"(+{WARMUP_COMMITS} warm-up), {elapsed:.0f} s"
    )
    print(
        f"| {'receiver':<44} | dashboards | frames | p50 ms | p95 ms | p99 ms | max ms | missing |"
    )
    print(f"|{'-' * 46}|-----------:|-------:|-------:|-------:|-------:|-------:|--------:|")
    for row in rows:
        print(row)
    print()
    print(f"The idle web process's live feed over {IDLE_WINDOW_S:.0f} s, dashboards connected:")
    print("| dashboards | polls per s   | queries per s   |")
    print("|-----------:|--------------:|----------------:|")
    for row in idle:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
