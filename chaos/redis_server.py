"""A private ``redis-server`` on a free loopback port, without persistence (a restart loses every
key: the term counter, leases, presences, locks), started and stopped by PID.

One launcher for everything that needs Redis processes of its own: the chaos run's coordination
Redis and Redlock masters, the test suite's servers, the benchmark's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
ERR_NO_REDIS_SERVER = "redis-server is not installed (the README's set-up installs it)"
ERR_REDIS_START = "redis-server on port {port} did not start"


def free_port() -> int:
    """A loopback port free now (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def terminate(process: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """SIGCONT (a stopped process cannot act on SIGTERM), SIGTERM, then SIGKILL: by PID."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    return process.returncode


@dataclass
class RedisServer:
    """One ``redis-server`` process; ``start`` after ``stop`` brings it back empty on its port."""

    name: str
    workdir: Path
    port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start it and wait until it answers PING. RuntimeError if the binary is missing
        (ERR_NO_REDIS_SERVER) or it does not answer within START_TIMEOUT_S."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(ERR_NO_REDIS_SERVER)
        Path(self.workdir).mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(ERR_REDIS_START.format(port=self.port))

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server (SIGSTOP freezes it, SIGCONT resumes it)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self, *, kill: bool = False) -> None:
        """Stop it by PID: SIGKILL at once with ``kill`` (a crash), else SIGTERM then SIGKILL."""
        if self.process is not None and self.process.poll() is None:
            if kill:
                self.process.kill()
                self.process.wait(timeout=5)
            else:
                terminate(self.process)
        self.process = None
