"""The nemesis of a chaos run: the processes it controls, the faults it injects, the operator.

Everything here runs on loopback and is started and stopped by PID:

- :class:`RedisServer`   (from ``cluster.verify.redis_server``) a private ``redis-server`` without
                         persistence: a restart loses its data;
- :class:`TcpProxy`      a small TCP forwarder between the nodes and MariaDB that the nemesis can
                         cut (every connection closed, new ones refused) to make the database
                         unreachable for a few seconds;
- :class:`LocalCluster`  the ``runnode`` processes (restarted under the same node id, one log file
                         per incarnation);
- :class:`FaultDeck`     the seeded choice of the next fault (kind, instant relative to a whole
                         second, duration, pause): every kind comes once per round, in a seeded order;
- :class:`Nemesis`       applies the faults, keeps 2-3 nodes running by restarting the ones it took
                         down, and logs every fault as a :class:`cluster.verify.checker.Fault`;
- :class:`Operator`      concurrent operator actions through the REST API (trigger, pause/resume,
                         edits, two edits racing on one version) with DRF's APIClient.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.verify.checker import ApiAnomaly, Fault
from cluster.verify.redis_server import RedisServer, terminate

logger = logging.getLogger(__name__)

# --- fault kinds ------------------------------------------------------------------------------------
SIGKILL_LEADER = "sigkill_leader"
SIGKILL_WORKER = "sigkill_worker"
SIGSTOP_LEADER = "sigstop_leader"
SIGSTOP_WORKER = "sigstop_worker"
SIGTERM_LEADER = "sigterm_leader"
SIGTERM_WORKER = "sigterm_worker"
REDIS_RESTART = "redis_restart"  # the coordination Redis restarted empty
REDLOCK_MASTER_DOWN = "redlock_master_down"  # one of the three Redlock masters killed a while
DB_DOWN = "db_down"  # the database unreachable from the nodes (MariaDB, through the proxy)
API_TRIGGER = "api_trigger"
API_PAUSE_RESUME = "api_pause_resume"
API_EDIT = "api_edit"
API_CONCURRENT_EDIT = "api_concurrent_edit"

NODE_FAULT_KINDS = (
    SIGKILL_LEADER,
    SIGKILL_WORKER,
    SIGSTOP_LEADER,
    SIGSTOP_WORKER,
    SIGTERM_LEADER,
    SIGTERM_WORKER,
)
REDIS_FAULT_KINDS = (REDIS_RESTART, REDLOCK_MASTER_DOWN)
OPERATOR_KINDS = (API_TRIGGER, API_PAUSE_RESUME, API_EDIT, API_CONCURRENT_EDIT)

# When a fault lands, relative to a whole second (the 1 s jobs' slot instants): just before (the
# next runs are marked running ahead of their instant, not started), at, just after (bodies in
# flight), and half-way between slots.
SLOT_OFFSETS_S = (-0.3, -0.1, -0.02, 0.0, 0.01, 0.05, 0.25, 0.5)
SIGSTOP_S = (3.0, 6.0)  # longer than the lease (2 s) and the presence TTL (2 s)
REDIS_DOWN_S = (0.5, 2.5)
REDLOCK_DOWN_S = (3.0, 8.0)
DB_DOWN_S = (2.0, 5.0)
RESTART_AFTER_S = (2.5, 5.0)  # a killed or stopped node comes back after this long
DRAIN_LIMIT_S = 20.0  # a SIGTERMed node still running this long after its restart was due
PAUSE_BETWEEN_S = (1.5, 4.0)
OPERATOR_EVERY_S = (0.7, 2.5)
PAUSED_FOR_S = (1.5, 4.0)

SIGNALS = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP, "sigterm": signal.SIGTERM}


# --- Redis ------------------------------------------------------------------------------------------


# --- the database proxy ----------------------------------------------------------------------------


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target``; ``cut()`` drops every connection and refuses new
    ones (accepted and closed at once) until ``restore()``. One selector thread; sockets are
    blocking with a send timeout, so a peer that stops reading (a frozen node) costs its own pair,
    not the others."""

    SEND_TIMEOUT_S = 5.0

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._peers: dict[socket.socket, socket.socket] = {}
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="db-proxy", daemon=True)

    def start(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._thread.start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in list(self._peers):
                self._close_pair(sock)

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for sock in list(self._peers):
                self._close_pair(sock)
        with contextlib.suppress(Exception):
            self._selector.unregister(self._listener)
        self._listener.close()
        self._selector.close()

    def _close_pair(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        for one in (sock, peer):
            if one is None:
                continue
            self._peers.pop(one, None)
            with contextlib.suppress(Exception):
                self._selector.unregister(one)
            with contextlib.suppress(OSError):
                one.close()

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        if self._cut.is_set():
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2.0)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.settimeout(self.SEND_TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._peers[client] = upstream
            self._peers[upstream] = client
            self._selector.register(client, selectors.EVENT_READ)
            self._selector.register(upstream, selectors.EVENT_READ)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(timeout=0.2)
            except OSError:
                continue
            for key, _ in events:
                sock = key.fileobj
                if sock is self._listener:
                    with contextlib.suppress(OSError):
                        self._accept()
                    continue
                with self._lock:
                    peer = self._peers.get(sock)  # type: ignore[arg-type]
                    if peer is None:
                        continue
                    try:
                        data = sock.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            raise ConnectionResetError
                        peer.sendall(data)
                    except OSError:
                        self._close_pair(sock)  # type: ignore[arg-type]


# --- the nodes ---------------------------------------------------------------------------------------


@dataclass
class NodeProcess:
    node_id: str
    incarnation: int
    process: subprocess.Popen
    log_path: Path
    log_file: Any
    frozen: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None


class LocalCluster:
    """``runnode`` processes sharing one environment. A node id keeps its name across restarts
    (as a host would); each incarnation writes its own log."""

    def __init__(self, *, root: Path, run_dir: Path, env: dict[str, str], args: Sequence[str]):
        self.root = root
        self.run_dir = run_dir
        self.env = env
        self.args = list(args)
        self.nodes: dict[str, NodeProcess] = {}
        self.logs: dict[str, list[Path]] = {}
        self._incarnations: dict[str, int] = {}
        self._retired: list[NodeProcess] = []

    def start(self, node_id: str) -> NodeProcess:
        incarnation = self._incarnations.get(node_id, -1) + 1
        self._incarnations[node_id] = incarnation
        log_path = self.run_dir / f"{node_id}.{incarnation}.log"
        log_file = open(log_path, "wb")  # closed in stop_all() / kill_all() / _retire()
        env = {**self.env, "SCHEDULER_NODE_ID": node_id}
        process = subprocess.Popen(
            [sys.executable, "manage.py", "runnode", "--node-id", node_id, *self.args],
            cwd=self.root,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        previous = self.nodes.get(node_id)
        if previous is not None:
            self._retire(previous)
        node = NodeProcess(node_id, incarnation, process, log_path, log_file)
        self.nodes[node_id] = node
        self.logs.setdefault(node_id, []).append(log_path)
        return node

    def _retire(self, node: NodeProcess) -> None:
        if node.alive():
            terminate(node.process)
        node.log_file.close()
        self._retired.append(node)

    def live(self) -> list[NodeProcess]:
        """Running and not frozen."""
        return [n for n in self.nodes.values() if n.alive() and not n.frozen]

    def signal(self, node: NodeProcess, signum: int) -> None:
        if node.alive():
            os.kill(node.pid, signum)
            if signum == signal.SIGSTOP:
                node.frozen = True
            elif signum == signal.SIGCONT:
                node.frozen = False

    def stop_all(self, timeout: float) -> list[str]:
        """Graceful: SIGCONT and SIGTERM to every node at once, wait, SIGKILL what is left.
        Returns the node ids that had to be killed."""
        for node in self.nodes.values():
            if node.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGCONT)
                    node.frozen = False
                    os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        killed = []
        for node in self.nodes.values():
            try:
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(node.node_id)
                node.process.kill()
                node.process.wait(timeout=5)
        for node in [*self.nodes.values(), *self._retired]:
            with contextlib.suppress(Exception):
                node.log_file.close()
        return killed

    def kill_all(self) -> None:
        """Last resort (an exception, Ctrl-C): every process we started, by PID."""
        for node in [*self.nodes.values(), *self._retired]:
            if node.alive():
                terminate(node.process, timeout=5)
            with contextlib.suppress(Exception):
                node.log_file.close()


# --- choosing faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    offset_s: float  # relative to the whole second it lands on
    duration_s: float  # SIGSTOP / outage length; 0 for instantaneous faults
    restart_after_s: float  # a node taken down comes back after this long
    pause_after_s: float  # quiet time before the next fault
    pick: float  # in [0, 1): which node/master, among the candidates at the time


class FaultDeck:
    """The seeded sequence of faults: each round deals every kind once, in a seeded order, so a
    short run still sees many kinds; the numbers of each fault come from the same generator."""

    def __init__(self, seed: int, kinds: Sequence[str]) -> None:
        if not kinds:
            raise ValueError("a fault deck needs at least one kind")
        self.rng = random.Random(seed)
        self.kinds = list(kinds)
        self._round: list[str] = []

    def next(self) -> FaultSpec:
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        kind = self._round.pop()
        rng = self.rng
        duration = {
            SIGSTOP_LEADER: SIGSTOP_S,
            SIGSTOP_WORKER: SIGSTOP_S,
            REDIS_RESTART: REDIS_DOWN_S,
            REDLOCK_MASTER_DOWN: REDLOCK_DOWN_S,
            DB_DOWN: DB_DOWN_S,
        }.get(kind, (0.0, 0.0))
        return FaultSpec(
            kind=kind,
            offset_s=rng.choice(SLOT_OFFSETS_S),
            duration_s=round(rng.uniform(*duration), 2),
            restart_after_s=round(rng.uniform(*RESTART_AFTER_S), 2),
            pause_after_s=round(rng.uniform(*PAUSE_BETWEEN_S), 2),
            pick=rng.random(),
        )

    def take(self, count: int) -> Iterator[FaultSpec]:
        for _ in range(count):
            yield self.next()


def next_instant(offset_s: float, *, now: float, lead_s: float = 0.5) -> float:
    """The first whole second + ``offset_s`` at least ``lead_s`` from ``now``."""
    instant = float(int(now)) + offset_s
    while instant < now + lead_s:
        instant += 1.0
    return instant


# --- injecting them ----------------------------------------------------------------------------------


class Nemesis:
    """Applies a :class:`FaultDeck` to a :class:`LocalCluster` (and its Redis servers and database
    proxy), one fault at a time, keeping every node not faulted running. Faults it cannot apply in
    a configuration (Redis faults on the database backend, the proxy on SQLite) are not dealt."""

    def __init__(
        self,
        *,
        cluster: LocalCluster,
        deck: FaultDeck,
        leader: Callable[[], str | None],
        say: Callable[[str], None],
        coordination_redis: RedisServer | None = None,
        redlock_masters: Sequence[RedisServer] = (),
        proxy: TcpProxy | None = None,
    ) -> None:
        self.cluster = cluster
        self.deck = deck
        self.leader = leader
        self.say = say
        self.redis = coordination_redis
        self.redlock = list(redlock_masters)
        self.proxy = proxy
        self.faults: list[Fault] = []
        self.incidents: list[str] = []  # nodes that crashed or would not stop
        self._restarts: dict[str, float] = {}  # node id -> when to start it again
        self._started = time.time()

    # -- time ---
    def _sleep_until(self, instant: float) -> None:
        """Sleep until ``instant``, restarting the nodes that are due meanwhile."""
        while True:
            self.service()
            left = instant - time.time()
            if left <= 0:
                return
            time.sleep(min(0.05, left))

    def service(self) -> None:
        """Restart the nodes that are due, and notice a node that exited on its own (a crash is
        an incident worth reporting; it is restarted at once so the cluster keeps its size)."""
        now = time.time()
        for node_id, node in self.cluster.nodes.items():
            if node_id not in self._restarts and not node.alive():
                self._incident(
                    f"{node_id} (pid {node.pid}) exited on its own with status "
                    f"{node.process.returncode}; see {node.log_path.name}"
                )
                self._restarts[node_id] = now
        for node_id, due in list(self._restarts.items()):
            node = self.cluster.nodes[node_id]
            if due > now:
                continue
            if node.alive():
                # A SIGTERMed node still draining past its grace is an incident too.
                if now - due > DRAIN_LIMIT_S:
                    self._incident(
                        f"{node_id} (pid {node.pid}) still draining {DRAIN_LIMIT_S:.0f} s after "
                        "its restart was due: killed"
                    )
                    node.process.kill()
                    node.process.wait(timeout=5)
                continue
            del self._restarts[node_id]
            fresh = self.cluster.start(node_id)
            self.say(f"restarted {node_id} (pid {fresh.pid})")

    def _incident(self, message: str) -> None:
        self.incidents.append(message)
        self.say(f"INCIDENT: {message}")

    def all_up(self) -> bool:
        return not self._restarts and len(self.cluster.live()) == len(self.cluster.nodes)

    def settle(self, deadline: float) -> None:
        """Wait until every node is back (or ``deadline``)."""
        while not self.all_up() and time.time() < deadline:
            self._sleep_until(time.time() + 0.1)

    def _log(self, spec: FaultSpec, target: str, start: float, pid: int | None = None) -> None:
        fault = Fault(
            kind=spec.kind,
            target=target,
            start=start,
            end=time.time(),
            pid=pid,
            detail=f"offset {spec.offset_s:+.2f} s"
            + (f", {spec.duration_s:.2f} s" if spec.duration_s else ""),
        )
        self.faults.append(fault)
        self.say(
            f"+{start - self._started:6.1f}s {fault.kind:<20} {target:<10} "
            f"{'pid ' + str(pid) if pid else '':<10} {fault.detail}"
        )

    # -- the loop ---
    def run(self, until: float) -> None:
        while time.time() < until:
            spec = self.deck.next()
            self.settle(until)
            if time.time() >= until:
                return
            instant = next_instant(spec.offset_s, now=time.time())
            if instant + spec.duration_s > until:
                return
            self._sleep_until(instant)
            self.apply(spec)
            self._sleep_until(time.time() + spec.pause_after_s)

    def apply(self, spec: FaultSpec) -> None:
        kind = spec.kind
        if kind in NODE_FAULT_KINDS:
            self._node_fault(spec)
        elif kind == REDIS_RESTART and self.redis is not None:
            start = time.time()
            self.redis.stop(kill=True)
            self._sleep_until(start + spec.duration_s)
            self.redis.start()
            self._log(spec, "redis", start)
        elif kind == REDLOCK_MASTER_DOWN and self.redlock:
            master = self.redlock[int(spec.pick * len(self.redlock))]
            start = time.time()
            master.stop(kill=True)
            self._sleep_until(start + spec.duration_s)
            master.start()
            self._log(spec, master.name, start)
        elif kind == DB_DOWN and self.proxy is not None:
            start = time.time()
            self.proxy.cut()
            self._sleep_until(start + spec.duration_s)
            self.proxy.restore()
            self._log(spec, "database", start)

    def _node_fault(self, spec: FaultSpec) -> None:
        live = self.cluster.live()
        if not live:
            return
        action, role = spec.kind.split("_")
        leader_id = self.leader()
        leader = next((n for n in live if n.node_id == leader_id), None)
        workers = sorted((n for n in live if n is not leader), key=lambda n: n.node_id)
        if role == "leader" and leader is not None:
            target = leader
        elif workers:
            target = workers[int(spec.pick * len(workers))]
            role = "worker"
        else:
            target = live[0]
        kind = f"{action}_{role}"
        spec = FaultSpec(
            kind, spec.offset_s, spec.duration_s, spec.restart_after_s, spec.pause_after_s, 0.0
        )
        start = time.time()
        self.cluster.signal(target, SIGNALS[action])
        if action == "sigstop":
            self._sleep_until(start + spec.duration_s)
            self.cluster.signal(target, signal.SIGCONT)
        else:
            self._restarts[target.node_id] = start + spec.restart_after_s
        self._log(spec, target.node_id, start, pid=target.pid)

    def recover(self, deadline: float) -> None:
        """After the last fault: everything back up (the nemesis always restores its outages when
        they end; nodes taken down are restarted now)."""
        for node in self.cluster.nodes.values():
            if node.frozen:
                self.cluster.signal(node, signal.SIGCONT)
        for node_id in list(self._restarts):
            self._restarts[node_id] = min(self._restarts[node_id], time.time())
        self.settle(deadline)


# --- the operator --------------------------------------------------------------------------------


class Operator:
    """Concurrent operator actions through the REST API, from this process, against the run's
    database: trigger a run, pause and later resume a job, edit it, and race two edits on one
    version (exactly one may win; the other gets 409). Every action is logged as a fault; an
    answer out of the contract (a 5xx, both racing edits winning) is an API anomaly."""

    def __init__(
        self, *, token: str, job_ids: Sequence[int], seed: int, say: Callable[[str], None]
    ):
        self.token = token
        self.job_ids = list(job_ids)
        self.rng = random.Random(seed)
        self.say = say
        self.faults: list[Fault] = []
        self.anomalies: list[ApiAnomaly] = []
        self.stop = threading.Event()
        self._paused: dict[int, float] = {}  # job id -> when to resume it
        self._thread = threading.Thread(target=self._loop, name="operator", daemon=True)

    def client(self) -> Any:
        from rest_framework.test import APIClient

        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {self.token}")
        return api

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop acting and resume every job still paused (the checker reads pause windows)."""
        self.stop.set()
        self._thread.join(timeout)
        api = self.client()
        for job_id in list(self._paused):
            self._call(api, "post", f"/api/jobs/{job_id}/resume/", API_PAUSE_RESUME)
            self._paused.pop(job_id, None)
        from django.db import connection

        connection.close()

    def _loop(self) -> None:
        from django.db import connection

        api = self.client()
        try:
            while not self.stop.wait(self.rng.uniform(*OPERATOR_EVERY_S)):
                try:
                    self._act(api)
                except Exception as exc:  # an action must never end the run: it is a finding
                    self._anomaly("operator", repr(exc))
                    connection.close()
        finally:
            connection.close()

    def _call(self, api: Any, method: str, path: str, action: str, **kwargs: Any) -> Any:
        if method != "get":
            kwargs["format"] = "json"
        response = getattr(api, method)(path, **kwargs)
        if response.status_code >= 500:
            self._anomaly(action, f"{method.upper()} {path}: {response.status_code}")
        return response

    def _anomaly(self, action: str, detail: str) -> None:
        self.anomalies.append(ApiAnomaly(time.time(), action, detail))
        self.say(f"API anomaly: {action}: {detail}")

    def _act(self, api: Any) -> None:
        now = time.time()
        for job_id, due in list(self._paused.items()):
            if due <= now:
                start = time.time()
                self._call(api, "post", f"/api/jobs/{job_id}/resume/", API_PAUSE_RESUME)
                del self._paused[job_id]
                self._record(API_PAUSE_RESUME, job_id, start, "resume")
        roll = self.rng.random()
        job_id = self.rng.choice(self.job_ids)
        start = time.time()
        if roll < 0.4:
            self._call(api, "post", f"/api/jobs/{job_id}/trigger/", API_TRIGGER)
            self._record(API_TRIGGER, job_id, start)
        elif roll < 0.7:
            current = self._call(api, "get", f"/api/jobs/{job_id}/", API_EDIT).json()
            self._call(
                api,
                "patch",
                f"/api/jobs/{job_id}/",
                API_EDIT,
                data={"description": f"edited at {start:.3f}", "version": current["version"]},
            )
            self._record(API_EDIT, job_id, start)
        elif roll < 0.85:
            self._race(api, job_id, start)
        elif job_id not in self._paused:
            self._call(api, "post", f"/api/jobs/{job_id}/pause/", API_PAUSE_RESUME)
            self._paused[job_id] = time.time() + self.rng.uniform(*PAUSED_FOR_S)
            self._record(API_PAUSE_RESUME, job_id, start, "pause")

    def _race(self, api: Any, job_id: int, start: float) -> None:
        """Two operators edit the same job from the same version at the same moment."""
        from django.db import connection

        version = self._call(api, "get", f"/api/jobs/{job_id}/", API_CONCURRENT_EDIT).json()[
            "version"
        ]
        barrier = threading.Barrier(2)
        statuses: list[int] = []

        def edit(which: int) -> None:
            try:
                other = self.client()
                barrier.wait(timeout=5)
                response = self._call(
                    other,
                    "patch",
                    f"/api/jobs/{job_id}/",
                    API_CONCURRENT_EDIT,
                    # Both edits really change the job (an edit to the value it already has
                    # is a no-op that rightly succeeds), and neither touches what scheduling
                    # reads: a priority would reorder the claims of a cluster that is behind.
                    data={"description": f"race {start:.3f} #{which}", "version": version},
                )
                statuses.append(response.status_code)
            finally:
                connection.close()

        threads = [threading.Thread(target=edit, args=(i,)) for i in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if sorted(statuses) != [200, 409]:
            self._anomaly(
                API_CONCURRENT_EDIT,
                f"job {job_id}: two edits of version {version} answered {sorted(statuses)} "
                "(expected one 200 and one 409)",
            )
        self._record(API_CONCURRENT_EDIT, job_id, start, f"answers {sorted(statuses)}")

    def _record(self, kind: str, job_id: int, start: float, detail: str = "") -> None:
        self.faults.append(Fault(kind, f"job {job_id}", start, time.time(), detail=detail))
