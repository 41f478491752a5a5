"""The nemesis's TCP paths (chaos.links) on real loopback sockets: bytes move, a hang
holds them, and a connection closed by either end is closed on the link too, so a long chaos run
with thousands of reconnections does not run out of file descriptors."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from chaos.links import Link, Mode


@pytest.fixture
def echo():
    """An echo server on a free loopback port: (host, port)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()
    stop.set()
    thread.join(2)
    server.close()


@pytest.fixture
def link(echo):
    made = Link("test", echo).start()
    yield made
    made.close()


def _settle(link: Link, open_sockets: int, within_s: float = 5.0) -> int:
    """Wait until the link holds ``open_sockets`` sockets (or the time is up); what it holds."""
    deadline = time.monotonic() + within_s
    while link.open_sockets() != open_sockets and time.monotonic() < deadline:
        time.sleep(0.02)
    return link.open_sockets()


def _round_trip(port: int, payload: bytes = b"ping") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(payload)
        return conn.recv(4096)


def test_bytes_move_and_closed_connections_leave_nothing_open(link):
    for _ in range(50):
        assert _round_trip(link.port) == b"ping"
    assert _settle(link, 0) == 0


def test_a_hang_holds_bytes_until_the_heal_and_abandoned_connections_are_closed(link):
    conn = socket.create_connection(("127.0.0.1", link.port), timeout=2)
    conn.sendall(b"before")
    assert conn.recv(4096) == b"before"
    link.set(Mode.HANG)
    conn.sendall(b"held")
    conn.settimeout(0.3)
    with pytest.raises(TimeoutError):
        conn.recv(4096)
    # Clients that give up during the hang (a timeout, a killed process) close their end.
    for _ in range(20):
        with contextlib.closing(socket.create_connection(("127.0.0.1", link.port), timeout=2)):
            pass
    link.heal()
    conn.settimeout(2)
    assert conn.recv(4096) == b"held"
    conn.close()
    assert _settle(link, 0) == 0


def test_a_reset_closes_every_connection(link):
    conn = socket.create_connection(("127.0.0.1", link.port), timeout=2)
    conn.sendall(b"x")
    assert conn.recv(4096) == b"x"
    link.set(Mode.RESET)
    conn.settimeout(2)
    with contextlib.suppress(OSError):
        assert conn.recv(4096) == b""
    conn.close()
    link.heal()
    assert _round_trip(link.port) == b"ping"
    assert _settle(link, 0) == 0
