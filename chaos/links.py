"""Network paths the nemesis controls: one TCP forwarder per (node, service), on loopback.

Each node reaches the database and every Redis server through a :class:`Link` of its own, so a fault
can cut one node off one service as an operator's network would:

- ``hang``: nothing is delivered in either direction. Connections stay open, bytes are held (not
  lost: they are delivered when the link heals, as TCP retransmission would), reads hang until the
  client's own timeout, and a new connection is accepted but reaches nothing until the heal;
- ``one_way``: requests are delivered, answers are held (the server acts, the client never hears);
- ``slow``: every chunk is delayed by ``latency_s`` in each direction;
- ``reset``: every connection is closed at once and new ones are refused (accepted and closed):
  the fast failure a restarted server or a reset gives.

A :class:`LinkSet` holds a node's links by service name (``database``, ``redis``, ``redlock-0`` ...).
Two threads per connection move the bytes (one per direction); a held direction parks its thread
after the read, before the write.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import threading
import time
from collections.abc import Iterable

# A pump looks at the link's mode this often while it holds bytes (seconds).
HOLD_POLL_S = 0.02
ACCEPT_POLL_S = 0.2
CONNECT_TIMEOUT_S = 2.0
CHUNK = 65536


class Mode(enum.Enum):
    HEALTHY = "healthy"
    HANG = "hang"
    ONE_WAY = "one_way"
    SLOW = "slow"
    RESET = "reset"


class Link:
    """Forward ``127.0.0.1:<port>`` to ``target`` under the current :class:`Mode`."""

    def __init__(self, name: str, target: tuple[str, int]) -> None:
        self.name = name
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._mode = Mode.HEALTHY
        self.latency_s = 0.0
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept_loop, name=f"link-{name}", daemon=True)

    # --- control ---------------------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        return self._mode

    def set(self, mode: Mode, *, latency_s: float = 0.0) -> None:
        with self._changed:
            self._mode = mode
            self.latency_s = latency_s if mode == Mode.SLOW else 0.0
            self._changed.notify_all()
        if mode == Mode.RESET:
            self._close_all()

    def heal(self) -> None:
        self.set(Mode.HEALTHY)

    def start(self) -> Link:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=5)
        self._close_all()
        self._listener.close()

    def _close_all(self) -> None:
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    # --- holding ---------------------------------------------------------------------------------
    def _held(self, upstream: bool) -> bool:
        mode = self._mode
        return mode == Mode.HANG or (mode == Mode.ONE_WAY and not upstream)

    def _wait_open(self, upstream: bool) -> bool:
        """Block while this direction is held; False when the link closes or resets."""
        with self._changed:
            while self._held(upstream) and not self._stop.is_set():
                self._changed.wait(HOLD_POLL_S)
            return not self._stop.is_set() and self._mode != Mode.RESET

    # --- moving bytes ----------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._mode == Mode.RESET:
                client.close()
                continue
            threading.Thread(
                target=self._connect, args=(client,), name=f"link-{self.name}-conn", daemon=True
            ).start()

    def _track(self, *sockets: socket.socket) -> bool:
        with self._lock:
            if self._stop.is_set():
                return False
            self._sockets.update(sockets)
        return True

    def _forget(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(sockets)
        _close(*sockets)

    def open_sockets(self) -> int:
        """Sockets this link holds open now (both ends of every forwarded connection)."""
        with self._lock:
            return len(self._sockets)

    def _connect(self, client: socket.socket) -> None:
        # A new connection through a hung link reaches nothing until the heal.
        if not self._track(client) or not self._wait_open(upstream=True):
            self._forget(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=CONNECT_TIMEOUT_S)
        except OSError:
            self._forget(client)
            return
        upstream.settimeout(None)
        client.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self._track(upstream):
            self._forget(client, upstream)
            return
        # The pair is closed once both directions are done (an end of stream passed on, an
        # error, a reset): a half-closed connection keeps its other direction open meanwhile.
        done = [0]
        threading.Thread(
            target=self._pump, args=(client, upstream, True, done), daemon=True, name="link-up"
        ).start()
        self._pump(upstream, client, False, done)

    def _pump(
        self, source: socket.socket, sink: socket.socket, upstream: bool, done: list[int]
    ) -> None:
        both = False
        try:
            while True:
                data = source.recv(CHUNK)
                if not self._wait_open(upstream):
                    both = True
                    break
                latency = self.latency_s
                if latency:
                    time.sleep(latency)
                if not data:
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)
                    break
                sink.sendall(data)
        except OSError:
            both = True
        with self._lock:
            done[0] += 2 if both else 1
            if done[0] < 2:
                return  # the other direction still flows
            self._sockets.discard(source)
            self._sockets.discard(sink)
        _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.close()


class LinkSet:
    """One node's links, by service."""

    def __init__(self, node_id: str, targets: dict[str, tuple[str, int]]) -> None:
        self.node_id = node_id
        self.links = {
            service: Link(f"{node_id}-{service}", target).start()
            for service, target in targets.items()
        }

    def port(self, service: str) -> int:
        return self.links[service].port

    def select(self, services: Iterable[str]) -> list[Link]:
        """The links of these services (``redis`` names the coordination Redis and every
        Redlock master: a node cut off from Redis reaches none of them)."""
        chosen = []
        for service in services:
            if service == "redis":
                chosen += [link for name, link in self.links.items() if name.startswith("redis")]
                chosen += [link for name, link in self.links.items() if name.startswith("redlock")]
            elif service in self.links:
                chosen.append(self.links[service])
        return chosen

    def set(self, services: Iterable[str], mode: Mode, *, latency_s: float = 0.0) -> None:
        for link in self.select(services):
            link.set(mode, latency_s=latency_s)

    def heal(self) -> None:
        for link in self.links.values():
            link.heal()

    def close(self) -> None:
        for link in self.links.values():
            link.close()
