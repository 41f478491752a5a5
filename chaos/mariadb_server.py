"""A private MariaDB server on a free loopback port, for a chaos run that kills and restarts its
database: a data directory of its own (``mariadb-install-db``), durable commits (a SIGKILL loses
nothing committed: InnoDB recovers on the next start), started and stopped by PID. The machine's
own server is never touched."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos.redis_server import free_port, terminate

START_TIMEOUT_S = 60.0
ERR_NO_MARIADB = "mariadbd / mariadb-install-db are not installed (apt-get install mariadb-server)"
ERR_INSTALL = "mariadb-install-db failed: {output}"
ERR_START = "the private MariaDB on port {port} did not start; see {log}"
MARIADBD = ("mariadbd", "/usr/sbin/mariadbd")


def _binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name) or (name if Path(name).exists() else None)
        if found:
            return found
    return None


@dataclass
class MariaDBServer:
    """One ``mariadbd`` with a data directory under ``workdir``; ``start`` after ``stop(kill=True)``
    is a crash and a recovery on the same port."""

    workdir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mariadb.err"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def install(self) -> None:
        installer = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
        if installer is None or _binary(MARIADBD) is None:
            raise RuntimeError(ERR_NO_MARIADB)
        self.workdir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            [
                installer,
                "--no-defaults",
                f"--datadir={self.workdir / 'data'}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--user=root",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(ERR_INSTALL.format(output=(result.stdout + result.stderr)[-800:]))

    def start(self) -> None:
        binary = _binary(MARIADBD)
        if binary is None:
            raise RuntimeError(ERR_NO_MARIADB)
        log = open(self.log_path, "ab")  # the server writes its own log; this catches the rest
        self.process = subprocess.Popen(
            [
                binary,
                "--no-defaults",
                f"--datadir={self.workdir / 'data'}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.workdir / 'mariadb.sock'}",
                f"--pid-file={self.workdir / 'mariadb.pid'}",
                f"--log-error={self.log_path}",
                "--user=root",
                # A row-based log of every transaction, in commit order: the checker reads which
                # term wrote what from it (chaos.binlog).
                f"--log-bin={self.workdir / 'binlog'}",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--server-id=1",
                "--innodb-buffer-pool-size=128M",
                "--max-connections=300",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_unicode_ci",
                "--transaction-isolation=READ-COMMITTED",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    sock.settimeout(0.5)
                    if sock.recv(4):  # the server's greeting: it accepts clients
                        return
            except OSError:
                time.sleep(0.05)
        self.stop(kill=True)
        raise RuntimeError(ERR_START.format(port=self.port, log=self.log_path))

    def stop(self, *, kill: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            if kill:
                self.process.kill()
                self.process.wait(timeout=10)
            else:
                terminate(self.process, timeout=30)
        self.process = None
