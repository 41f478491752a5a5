"""The nemesis of a chaos run: the faults it deals and how it injects them (a little over the usual
size: one table of fault kinds and the one function that applies each).

Everything runs on loopback and is started and stopped by PID. The faults, in the forms a
production network and its operators produce them:

- node faults: SIGKILL, SIGSTOP (longer than the lease), SIGTERM of the leader or of a worker;
- partitions of one node from one service, with hang semantics (bytes held, not connections
  reset): from the database, from Redis (the coordination server and every Redlock master), from
  both; one-way (requests delivered, answers held); slow links (latency added on one node's path);
- services: the database cut off from every node at once with resets, the private MariaDB killed
  and restarted, the coordination Redis restarted empty or frozen (SIGSTOP), a Redlock master down;
- a node's wall clock stepped forward or back by several seconds, then back in step;
- faults that overlap: two nodes killed at once, the new leader killed as soon as it takes over,
  the whole cluster stopped and started again.

:class:`FaultDeck` deals them seeded (every kind once per round, in a seeded order, each at an
offset from a whole second: the 1 s jobs' slot instants, or between them); :class:`Nemesis` applies
them to the processes (:mod:`chaos.processes`), the links (:mod:`chaos.links`)
and the servers, keeps every node not faulted running, and logs every fault as a
:class:`chaos.record.Fault`.
"""

from __future__ import annotations

import logging
import random
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from chaos.faults import (
    CLOCK_JUMP,
    CLUSTER_RESTART,
    DB_DOWN,
    KILL_IN_RECOVERY,
    MARIADB_RESTART,
    NODE_FAULT_KINDS,
    ONEWAY_DB_LEADER,
    ONEWAY_REDIS_LEADER,
    PARTITION_BOTH_LEADER,
    PARTITION_BOTH_WORKER,
    PARTITION_DB_LEADER,
    PARTITION_DB_WORKER,
    PARTITION_REDIS_LEADER,
    PARTITION_REDIS_WORKER,
    REDIS_FREEZE,
    REDIS_RESTART,
    REDLOCK_MASTER_DOWN,
    SIGSTOP_LEADER,
    SIGSTOP_WORKER,
    SLOW_DB_LEADER,
    SLOW_REDIS_LEADER,
    TWO_DOWN,
)
from chaos.links import LinkSet, Mode
from chaos.mariadb_server import MariaDBServer
from chaos.processes import LocalCluster, NodeProcess
from chaos.record import Fault
from chaos.redis_server import RedisServer

logger = logging.getLogger(__name__)

# One link fault: (services, mode) of the target node's links.
LINK_FAULTS: dict[str, tuple[tuple[str, ...], Mode]] = {
    PARTITION_DB_LEADER: (("database",), Mode.HANG),
    PARTITION_DB_WORKER: (("database",), Mode.HANG),
    PARTITION_REDIS_LEADER: (("redis",), Mode.HANG),
    PARTITION_REDIS_WORKER: (("redis",), Mode.HANG),
    PARTITION_BOTH_LEADER: (("database", "redis"), Mode.HANG),
    PARTITION_BOTH_WORKER: (("database", "redis"), Mode.HANG),
    ONEWAY_DB_LEADER: (("database",), Mode.ONE_WAY),
    ONEWAY_REDIS_LEADER: (("redis",), Mode.ONE_WAY),
    SLOW_DB_LEADER: (("database",), Mode.SLOW),
    SLOW_REDIS_LEADER: (("redis",), Mode.SLOW),
}

# When a fault lands, relative to a whole second (the 1 s jobs' slot instants): just before (the
# next runs are marked running ahead of their instant, not started), at, just after (bodies in
# flight), and half-way between slots.
SLOT_OFFSETS_S = (-0.3, -0.1, -0.02, 0.0, 0.01, 0.05, 0.25, 0.5)
SIGSTOP_S = (3.0, 6.0)  # longer than the lease (2 s) and the presence TTL (2 s)
REDIS_DOWN_S = (0.5, 2.5)
REDIS_FREEZE_S = (1.0, 4.0)
REDLOCK_DOWN_S = (3.0, 8.0)
DB_DOWN_S = (2.0, 5.0)
MARIADB_DOWN_S = (0.5, 4.0)
PARTITION_S = (2.0, 12.0)
# One partition in LONG_PARTITION_SHARE lasts LONG_PARTITION_S instead.
LONG_PARTITION_S = 30.0
LONG_PARTITION_SHARE = 0.2
SLOW_S = (4.0, 12.0)
SLOW_LATENCY_S = (0.05, 0.8)  # added to every chunk, each way
CLOCK_JUMP_S = (3.0, 8.0)  # the step, forward or back
CLOCK_OFF_S = (5.0, 20.0)  # how long the clock stays off before it is stepped back
CLUSTER_DOWN_S = (3.0, 10.0)
RESTART_AFTER_S = (2.5, 5.0)  # a killed or stopped node comes back after this long
# kill_in_recovery: how long to wait for the successor to take over before giving up on it.
SUCCESSOR_WAIT_S = 10.0
DRAIN_LIMIT_S = 20.0  # a SIGTERMed node still running this long after its restart was due
PAUSE_BETWEEN_S = (1.5, 4.0)

SIGNALS = {"sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP, "sigterm": signal.SIGTERM}


# --- choosing faults ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    offset_s: float  # relative to the whole second it lands on
    duration_s: float  # how long the fault lasts; 0 for instantaneous faults
    restart_after_s: float  # a node taken down comes back after this long
    pause_after_s: float  # quiet time before the next fault
    pick: float  # in [0, 1): which node/master, among the candidates at the time
    magnitude: float = 0.0  # a slow link's latency, a clock step (seconds, signed)


DURATIONS: dict[str, tuple[float, float]] = {
    SIGSTOP_LEADER: SIGSTOP_S,
    SIGSTOP_WORKER: SIGSTOP_S,
    REDIS_RESTART: REDIS_DOWN_S,
    REDIS_FREEZE: REDIS_FREEZE_S,
    REDLOCK_MASTER_DOWN: REDLOCK_DOWN_S,
    DB_DOWN: DB_DOWN_S,
    MARIADB_RESTART: MARIADB_DOWN_S,
    CLOCK_JUMP: CLOCK_OFF_S,
    CLUSTER_RESTART: CLUSTER_DOWN_S,
    SLOW_DB_LEADER: SLOW_S,
    SLOW_REDIS_LEADER: SLOW_S,
    **{kind: PARTITION_S for kind in LINK_FAULTS if LINK_FAULTS[kind][1] != Mode.SLOW},
}


class FaultDeck:
    """The seeded sequence of faults: each round deals every kind once, in a seeded order, so a
    short run still sees many kinds; the numbers of each fault come from the same generator.
    ``durations`` fixes the length of every fault that has one (a scenario's partition table)."""

    def __init__(self, seed: int, kinds: Sequence[str], *, durations: Sequence[float] = ()) -> None:
        if not kinds:
            raise ValueError("a fault deck needs at least one kind")
        self.rng = random.Random(seed)
        self.kinds = list(kinds)
        self.durations = list(durations)
        self._round: list[str] = []
        self._dealt = 0

    def next(self) -> FaultSpec:
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        kind = self._round.pop()
        rng = self.rng
        low, high = DURATIONS.get(kind, (0.0, 0.0))
        duration = round(rng.uniform(low, high), 2)
        if kind in LINK_FAULTS and LINK_FAULTS[kind][1] == Mode.HANG:
            if rng.random() < LONG_PARTITION_SHARE:
                duration = LONG_PARTITION_S
        if self.durations and high > 0:
            duration = self.durations[self._dealt % len(self.durations)]
        self._dealt += 1
        magnitude = 0.0
        if kind in (SLOW_DB_LEADER, SLOW_REDIS_LEADER):
            magnitude = round(rng.uniform(*SLOW_LATENCY_S), 3)
        elif kind == CLOCK_JUMP:
            magnitude = round(rng.uniform(*CLOCK_JUMP_S), 2) * rng.choice((-1, 1))
        return FaultSpec(
            kind=kind,
            offset_s=rng.choice(SLOT_OFFSETS_S),
            duration_s=duration,
            restart_after_s=round(rng.uniform(*RESTART_AFTER_S), 2),
            pause_after_s=round(rng.uniform(*PAUSE_BETWEEN_S), 2),
            pick=rng.random(),
            magnitude=magnitude,
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
    """Applies a :class:`FaultDeck` to a :class:`LocalCluster`, its links and its servers, one
    fault at a time, keeping every node not faulted running. The runner deals only the kinds its
    configuration can take (no Redis faults on the database backend, no database links on
    SQLite, no restarts of a database server the run does not own)."""

    def __init__(
        self,
        *,
        cluster: LocalCluster,
        deck: FaultDeck,
        leader: Callable[[], str | None],
        newest_term: Callable[[], tuple[int, str] | None],
        say: Callable[[str], None],
        links: Mapping[str, LinkSet] | None = None,
        coordination_redis: RedisServer | None = None,
        redlock_masters: Sequence[RedisServer] = (),
        mariadb: MariaDBServer | None = None,
    ) -> None:
        self.cluster = cluster
        self.deck = deck
        self.leader = leader
        self.newest_term = newest_term
        self.say = say
        self.links = dict(links or {})
        self.redis = coordination_redis
        self.redlock = list(redlock_masters)
        self.mariadb = mariadb
        self.faults: list[Fault] = []
        self.incidents: list[str] = []  # nodes that crashed or would not stop
        self._restarts: dict[str, float] = {}  # node id -> when to start it again
        self._held: set[str] = set()  # node ids kept down until released (cluster_restart)
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
            if node_id not in self._restarts and node_id not in self._held and not node.alive():
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
        return (
            not self._restarts
            and not self._held
            and len(self.cluster.live()) == len(self.cluster.nodes)
        )

    def settle(self, deadline: float) -> None:
        """Wait until every node is back (or ``deadline``)."""
        while not self.all_up() and time.time() < deadline:
            self._sleep_until(time.time() + 0.1)

    def _log(
        self,
        spec: FaultSpec,
        target: str,
        start: float,
        pid: int | None = None,
        *,
        kind: str | None = None,
        end: float | None = None,
    ) -> None:
        detail = f"offset {spec.offset_s:+.2f} s"
        if spec.duration_s:
            detail += f", {spec.duration_s:.2f} s"
        if spec.magnitude:
            detail += f", {'latency' if 'slow' in spec.kind else 'step'} {spec.magnitude:+.3f} s"
        fault = Fault(
            kind=kind or spec.kind,
            target=target,
            start=start,
            end=end if end is not None else time.time(),
            pid=pid,
            detail=detail,
            magnitude=spec.magnitude,
        )
        self.faults.append(fault)
        self.say(
            f"+{start - self._started:6.1f}s {fault.kind:<22} {target:<10} "
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
        elif kind in LINK_FAULTS:
            self._link_fault(spec)
        elif kind == DB_DOWN and self.links:
            self._outage(spec, "database", lambda: self._set_all("database", Mode.RESET))
        elif kind == MARIADB_RESTART and self.mariadb is not None:
            mariadb = self.mariadb
            self._outage(spec, "mariadb", lambda: mariadb.stop(kill=True), mariadb.start)
        elif kind == REDIS_RESTART and self.redis is not None:
            redis = self.redis
            self._outage(spec, "redis", lambda: redis.stop(kill=True), redis.start)
        elif kind == REDIS_FREEZE and self.redis is not None:
            redis = self.redis
            self._outage(
                spec,
                "redis",
                lambda: redis.signal(signal.SIGSTOP),
                lambda: redis.signal(signal.SIGCONT),
            )
        elif kind == REDLOCK_MASTER_DOWN and self.redlock:
            master = self.redlock[int(spec.pick * len(self.redlock))]
            self._outage(spec, master.name, lambda: master.stop(kill=True), master.start)
        elif kind == CLOCK_JUMP:
            self._clock_jump(spec)
        elif kind == TWO_DOWN:
            self._two_down(spec)
        elif kind == KILL_IN_RECOVERY:
            self._kill_in_recovery(spec)
        elif kind == CLUSTER_RESTART:
            self._cluster_restart(spec)

    def _outage(
        self,
        spec: FaultSpec,
        target: str,
        begin: Callable[[], None],
        end: Callable[[], None] | None = None,
    ) -> None:
        start = time.time()
        begin()
        self._sleep_until(start + spec.duration_s)
        if end is not None:
            end()
        else:
            for links in self.links.values():
                links.heal()
        self._log(spec, target, start)

    def _set_all(self, service: str, mode: Mode) -> None:
        for links in self.links.values():
            links.set([service], mode)

    # -- picking a node ---
    def _pick(self, role: str, pick: float) -> tuple[NodeProcess | None, str]:
        """The node a fault of ``role`` lands on, and the role it really had then."""
        live = self.cluster.live()
        if not live:
            return None, role
        leader_id = self.leader()
        leader = next((n for n in live if n.node_id == leader_id), None)
        workers = sorted((n for n in live if n is not leader), key=lambda n: n.node_id)
        if role == "leader" and leader is not None:
            return leader, "leader"
        if workers:
            return workers[int(pick * len(workers))], "worker"
        return live[0], "leader" if live[0] is leader else "worker"

    def _node_fault(self, spec: FaultSpec) -> None:
        action, role = spec.kind.split("_")
        target, role = self._pick(role, spec.pick)
        if target is None:
            return
        kind = f"{action}_{role}"
        start = time.time()
        self.cluster.signal(target, SIGNALS[action])
        if action == "sigstop":
            self._sleep_until(start + spec.duration_s)
            self.cluster.signal(target, signal.SIGCONT)
        else:
            self._restarts[target.node_id] = start + spec.restart_after_s
        self._log(spec, target.node_id, start, pid=target.pid, kind=kind)

    def _link_fault(self, spec: FaultSpec) -> None:
        services, mode = LINK_FAULTS[spec.kind]
        wanted = spec.kind.rsplit("_", 1)[1]
        target, role = self._pick(wanted, spec.pick)
        if target is None or target.node_id not in self.links:
            return
        kind = spec.kind.rsplit("_", 1)[0] + f"_{role}"
        links = self.links[target.node_id]
        start = time.time()
        links.set(services, mode, latency_s=spec.magnitude)
        self._sleep_until(start + spec.duration_s)
        links.heal()
        self._log(spec, target.node_id, start, pid=target.pid, kind=kind)

    def _clock_jump(self, spec: FaultSpec) -> None:
        target, _ = self._pick("worker" if spec.pick < 0.5 else "leader", spec.pick * 2 % 1)
        if target is None:
            return
        clock = self.cluster.clock(target.node_id)
        if clock is None:
            return
        start = time.time()
        clock.step(spec.magnitude)
        self._sleep_until(start + spec.duration_s)
        clock.step(0.0)
        self._log(spec, target.node_id, start, pid=target.pid)

    def _kill(self, node: NodeProcess, spec: FaultSpec, kind: str) -> None:
        start = time.time()
        self.cluster.signal(node, signal.SIGKILL)
        self._restarts[node.node_id] = start + spec.restart_after_s
        self._log(spec, node.node_id, start, pid=node.pid, kind=kind)

    def _two_down(self, spec: FaultSpec) -> None:
        leader, _ = self._pick("leader", spec.pick)
        worker, _ = self._pick("worker", spec.pick)
        for node in {id(n): n for n in (leader, worker) if n is not None}.values():
            self._kill(node, spec, TWO_DOWN)

    def _kill_in_recovery(self, spec: FaultSpec) -> None:
        """The leader killed, and its successor killed the moment it records its term: the
        cluster must recover from a fault that lands inside its recovery from the first."""
        leader, role = self._pick("leader", spec.pick)
        if leader is None or role != "leader":
            return
        before = self.newest_term()
        self._kill(leader, spec, KILL_IN_RECOVERY)
        deadline = time.time() + SUCCESSOR_WAIT_S
        while time.time() < deadline:
            newest = self.newest_term()
            if newest is not None and (before is None or newest[0] > before[0]):
                successor = self.cluster.nodes.get(newest[1])
                if successor is not None and successor.alive() and not successor.frozen:
                    self._kill(successor, spec, KILL_IN_RECOVERY)
                return
            self._sleep_until(time.time() + 0.02)

    def _cluster_restart(self, spec: FaultSpec) -> None:
        """Every node stopped gracefully, the cluster down a while, then every node started: the
        misfire policies decide what the outage's slots become."""
        start = time.time()
        nodes = [n for n in self.cluster.nodes.values() if n.alive()]
        self._held = {n.node_id for n in self.cluster.nodes.values()}
        for node in nodes:
            self.cluster.signal(node, signal.SIGCONT)
            self.cluster.signal(node, signal.SIGTERM)
        for node in nodes:
            try:
                node.process.wait(timeout=DRAIN_LIMIT_S)
            except Exception:
                self._incident(f"{node.node_id} did not drain within {DRAIN_LIMIT_S:.0f} s: killed")
                node.process.kill()
                node.process.wait(timeout=5)
        stopped = time.time()
        self._sleep_until(start + max(spec.duration_s, stopped - start + 1.0))
        for node in nodes:
            self._log(spec, node.node_id, start, pid=node.pid)
        self._held = set()
        for node_id in list(self.cluster.nodes):
            self._restarts.pop(node_id, None)
            if not self.cluster.nodes[node_id].alive():
                fresh = self.cluster.start(node_id)
                self.say(f"restarted {node_id} (pid {fresh.pid})")

    def recover(self, deadline: float) -> None:
        """After the last fault: everything back up (the nemesis always restores its outages when
        they end; nodes taken down are restarted now)."""
        for node in self.cluster.nodes.values():
            if node.frozen:
                self.cluster.signal(node, signal.SIGCONT)
        for links in self.links.values():
            links.heal()
        for node_id in list(self._restarts):
            self._restarts[node_id] = min(self._restarts[node_id], time.time())
        self.settle(deadline)
