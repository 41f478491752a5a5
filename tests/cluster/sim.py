"""A deterministic in-process cluster: several nodes on one memory coordination store, one settable
clock, every loop stepped in the test's thread. No sleeps and no threads: time moves only when the
test says so, and everything due at an instant happens, in a fixed order, before the test looks.

    sim = make_sim(["n1", "n2", "n3"])   # the fixture: Django's now() follows the sim clock
    job = sim.create_job(name="every-second", interval_seconds=1)
    sim.advance(5)               # five seconds of cluster life, stepped every STEP_S
    sim.kill("n1")               # SIGKILL: the node does nothing more, its bodies vanish
    sim.freeze("n2"); sim.advance(6); sim.thaw("n2")   # SIGSTOP past the lease, SIGCONT
    sim.cut_database("n1"); sim.advance(8); sim.heal("n1")  # n1 partitioned from its database

``django.utils.timezone.now`` is patched to the simulated clock (the ``make_sim`` fixture), so rows'
auto-set times (``created_at``) and every service agree with the nodes on what time it is.

Each node is a real ``NodeRunner`` (elector, membership, leader work, reaper, executor with its
admission, self-fence, supervisor and finisher) on the real database; only the task bodies are
simulated: ``sim.work`` records its start in ``SimCluster.effects`` and lasts ``seconds`` (a job
kwarg) of simulated time, so a forbid job can overrun its interval without anyone sleeping.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import OperationalError, connection
from django.utils import timezone

from cluster.clock import SettableClock
from cluster.coordination.memory import MemoryBackend, MemoryStore
from cluster.dbhealth import is_connection_error
from cluster.executor.ledger import OVERFLOW_WAIT_S
from cluster.executor.output import call_task, task_context
from cluster.executor.runners import RunHost
from cluster.executor.runs import ActiveRun, Outcome
from cluster.executor.supervisor import SUPERVISE_INTERVAL_S
from cluster.models import NodeStatus, SchedulerNode
from cluster.node import NodeConfig, NodeRunner
from jobs import fencing, registry
from jobs.models import Job, SchedulerSetting
from jobs.registry import TaskContext, task
from jobs.services import SYSTEM, job_create
from jobs.states import ExecutionStatus

S = ExecutionStatus
# The clock moves in steps of this much; every loop due within a step runs at its end.
STEP_S = 0.05
# A loop that keeps saying "again at once" (a claim that filled up) runs at most this often per step.
MAX_PASSES_PER_STEP = 5
# The loops a node runs under its control bounds (cluster.node: leader, heartbeat, notifier).
CONTROL_LOOPS = frozenset({"heartbeat", "leader"})
# A loop whose pass failed for want of its database waits this long, as cluster.node._loop does.
ERROR_BACKOFF_S = 0.5
UNREACHABLE = "Lost connection to server during query (simulated partition)"


def _refuse(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
    raise OperationalError(2013, UNREACHABLE)


@dataclass
class Effect:
    """One body start of ``sim.work`` (the task's side effect)."""

    execution_id: int
    job: str
    scheduled_for: datetime | None
    attempt: int
    node: str
    at: float  # simulated wall-clock seconds


EFFECTS: list[Effect] = []
_CURRENT: dict[str, Any] = {}


@task("sim.work", takes_context=True)
def work(context: TaskContext, seconds: float = 0.0, fail: bool = False, fenced: str = "") -> str:
    """A simulated body: records its start; lasts ``seconds`` of simulated time (the runner holds
    its outcome until then); raises if ``fail``; given ``fenced`` (a row's name), ends with a
    fenced write of its token to that row (``SteppedRunner._fenced_write``)."""
    EFFECTS.append(
        Effect(
            execution_id=context.execution_id,
            job=context.job_name,
            scheduled_for=context.scheduled_for,
            attempt=context.attempt,
            node=_CURRENT.get("node", ""),
            at=_CURRENT["clock"].now(),
        )
    )
    if fail:
        raise RuntimeError("asked to fail")
    return "done"


@dataclass
class _Body:
    host: RunHost
    run: ActiveRun
    ends_at: float = 0.0
    outcome: Outcome | None = None
    # The body's last act: a fenced write of its token to the shop's table (``sim.work``'s
    # ``fenced`` kwarg names the row), checked against ``still_owner()`` first.
    fenced: str = ""


@dataclass
class FencedWrite:
    """A body's fenced write at its end: accepted, or refused as stale."""

    execution_id: int
    job: str
    token: int
    node: str
    accepted: bool
    still_owner: bool
    at: float


FENCED: list[FencedWrite] = []


class SteppedRunner:
    """Starts a body when the clock reaches its due instant (after the self-fence), calls the task
    at once, and queues its outcome when its simulated duration is over."""

    def __init__(self, node_id: str, clock: SettableClock) -> None:
        self.node_id = node_id
        self.clock = clock
        self.waiting: list[_Body] = []
        self.running: list[_Body] = []

    def launch(self, host: RunHost, runs: list[ActiveRun]) -> None:
        self.waiting.extend(_Body(host, run) for run in runs)

    def step(self) -> None:
        now = self.clock.now()
        due, self.waiting = (
            [b for b in self.waiting if b.run.due <= now],
            [b for b in self.waiting if b.run.due > now],
        )
        for body in due:
            run = body.run
            if not run.completed and not body.host.body_room():
                # A body thread would wait in ``may_start`` for another body to end (at most
                # OVERFLOW_WAIT_S): here the run waits for a later step instead.
                if run.room_wait_from is None:
                    run.room_wait_from = max(run.due, now)
                if now < run.room_wait_from + OVERFLOW_WAIT_S:
                    self.waiting.append(body)
                    continue
            if body.host.may_start(run):
                self._start(body, now)
        for body in [b for b in self.running if b.ends_at <= now]:
            self.running.remove(body)
            assert body.outcome is not None
            if body.fenced:
                self._fenced_write(body, now)
            body.host.complete(body.outcome, body_ended=True)

    def _fenced_write(self, body: _Body, now: float) -> None:
        """What a careful task does at the end of its work: write through the fence (its token
        against the largest the row has accepted). The row is a ``SchedulerSetting`` standing in
        for a table of the shop's own (any table with an integer token column will do)."""
        context = body.run.context
        assert context is not None and context.fencing_token is not None
        owner = context.still_owner()
        try:
            fencing.fenced_update(
                SchedulerSetting.objects.filter(name=body.fenced),
                token=context.fencing_token,
                field="value",
            )
            accepted = True
        except fencing.StaleToken:
            accepted = False
        FENCED.append(
            FencedWrite(
                execution_id=body.run.execution.pk,
                job=body.run.execution.job.name,
                token=context.fencing_token,
                node=self.node_id,
                accepted=accepted,
                still_owner=owner,
                at=now,
            )
        )

    def _start(self, body: _Body, now: float) -> None:
        run = body.run
        job = run.execution.job
        run.context = task_context(
            run.execution, run.cancel_event, lambda: body.host.still_owner(run)
        )
        if job.timeout_seconds:
            run.deadline = self.clock.monotonic() + job.timeout_seconds
        _CURRENT.update(node=self.node_id, clock=self.clock)
        args, kwargs = run.execution.call_arguments()
        try:
            value = call_task(registry.get_task(job.task), args, kwargs, run.context)
            outcome = Outcome(run, S.SUCCEEDED, result=value, started=now)
        except Exception as exc:
            outcome = Outcome(
                run,
                S.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                tb=traceback.format_exc(),
                started=now,
            )
        body.outcome = outcome
        body.ends_at = now + float(kwargs.get("seconds", 0.0))
        body.fenced = str(kwargs.get("fenced", ""))
        self.running.append(body)


@dataclass
class _Loop:
    name: str
    body: Callable[[], float]
    next_at: float = 0.0  # monotonic


@dataclass
class SimNode:
    runner: NodeRunner
    bodies: SteppedRunner
    loops: list[_Loop] = field(default_factory=list)
    alive: bool = True
    frozen: bool = False
    cut: bool = False  # partitioned from the database (the coordination store still answers)

    @property
    def node_id(self) -> str:
        return self.runner.config.node_id


def _supervise(executor: Any) -> float:
    executor.supervise_once()
    return SUPERVISE_INTERVAL_S


class SimCluster:
    def __init__(
        self,
        node_ids: Iterable[str] = ("n1", "n2", "n3"),
        *,
        start: float | None = None,
        **config: Any,
    ) -> None:
        # On a whole second, like the real clock's view of interval slots.
        self.clock = SettableClock(start if start is not None else float(int(time.time()) + 1))
        self.store = MemoryStore()
        self.config = config
        self.nodes: dict[str, SimNode] = {}
        EFFECTS.clear()
        FENCED.clear()
        self.effects = EFFECTS
        self.fenced = FENCED
        for node_id in node_ids:
            self.add(node_id)

    # --- time ---------------------------------------------------------------------------------------
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.clock.now(), tz=UTC)

    def advance(self, seconds: float, *, step: float = STEP_S) -> None:
        """Move time on by ``seconds``, stepping every live node after each ``step``."""
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.monotonic()))
            self.step()

    def advance_until(
        self, predicate: Callable[[], Any], *, limit: float, step: float = STEP_S
    ) -> float:
        """Advance until ``predicate()`` is true; returns the simulated seconds it took. Fails the
        test (AssertionError) if it is still false after ``limit`` seconds."""
        began = self.clock.monotonic()
        while not predicate():
            if self.clock.monotonic() - began >= limit:
                raise AssertionError(f"not true after {limit} simulated seconds")
            self.clock.advance(step)
            self.step()
        return self.clock.monotonic() - began

    def step(self) -> None:
        """Everything due now, node by node, in a fixed order."""
        for node in list(self.nodes.values()):
            if node.alive and not node.frozen:
                self._step_node(node)

    def _step_node(self, node: SimNode) -> None:
        runner, executor = node.runner, node.runner.executor
        now = self.clock.monotonic()
        for loop in node.loops:
            # A loop woken as its thread would be: the claimer by new fires, the leader by a
            # change, the starter by a claim (it sleeps until its next batch otherwise, and a run
            # claimed meanwhile for an earlier instant would wait for that batch).
            wake = (
                (loop.name == "claim" and runner._wake_claim.is_set())
                or (loop.name == "leader" and runner._wake_leader.is_set())
                or (loop.name == "starter" and executor.starter.woken.is_set())
            )
            passes = 0
            while (loop.next_at <= now or wake) and passes < MAX_PASSES_PER_STEP:
                if loop.name == "claim":
                    runner._wake_claim.clear()
                elif loop.name == "leader":
                    runner._wake_leader.clear()
                elif loop.name == "starter":
                    executor.starter.woken.clear()
                wake = False
                delay = self._pass(node, loop)
                loop.next_at = now + delay
                passes += 1
        with self._database(node, control=False):
            executor.extend_locks()
            node.bodies.step()
            try:
                executor.finisher.flush()
            except OperationalError as exc:
                if not (node.cut and is_connection_error(exc)):
                    raise

    def _pass(self, node: SimNode, loop: _Loop) -> float:
        """One pass of a loop, watched as the node's threads are; a pass that fails for want of
        the database backs off, as cluster.node._loop does (any other error fails the test)."""
        with self._database(node, control=loop.name in CONTROL_LOOPS):
            try:
                return loop.body()
            except OperationalError as exc:
                if not (node.cut and is_connection_error(exc)):
                    raise
                node.runner.database.failed(exc, f"the {loop.name} loop")
                return ERROR_BACKOFF_S

    @contextlib.contextmanager
    def _database(self, node: SimNode, *, control: bool) -> Iterator[None]:
        """The node's database calls as its health watches them; refused while it is cut off."""
        with node.runner.database.thread(control=control):
            if node.cut:
                with connection.execute_wrapper(_refuse):
                    yield
            else:
                yield

    # --- nodes --------------------------------------------------------------------------------------
    def add(self, node_id: str, **config: Any) -> SimNode:
        """Start a node (registered, its loops due at once); ``config`` overrides the cluster's
        NodeConfig fields for this node (e.g. ``queues``)."""
        backend = MemoryBackend(store=self.store, clock=self.clock)
        bodies = SteppedRunner(node_id, self.clock)
        runner = NodeRunner(
            NodeConfig(node_id=node_id, **{**self.config, **config}),
            backend,
            clock=self.clock,
            runner=bodies,
            inline=True,
        )
        runner.register()
        executor = runner.executor
        node = SimNode(runner, bodies)
        node.loops = [
            _Loop("election", runner.election_once),
            _Loop("presence", runner.presence_once),
            _Loop("heartbeat", runner.heartbeat_once),
            _Loop("leader", runner.leader_once),
            _Loop("claim", runner.claim_once),
            _Loop("starter", executor.starter_step),
            _Loop("supervisor", lambda: _supervise(executor)),
        ]
        self.nodes[node_id] = node
        return node

    def kill(self, node_id: str) -> None:
        """SIGKILL: the node does nothing more; bodies it was running vanish with it (their side
        effects stay)."""
        node = self.nodes[node_id]
        node.alive = False
        node.bodies.waiting.clear()
        node.bodies.running.clear()

    def freeze(self, node_id: str) -> None:
        """SIGSTOP: the node's loops and bodies stand still until ``thaw``."""
        self.nodes[node_id].frozen = True

    def thaw(self, node_id: str) -> None:
        """SIGCONT: every loop is overdue and runs at the next step, in its usual order."""
        self.nodes[node_id].frozen = False

    def cut_database(self, node_id: str) -> None:
        """Partition the node from its database (it still reaches the coordination store): every
        statement it sends fails as a read timeout would."""
        self.nodes[node_id].cut = True

    def heal(self, node_id: str) -> None:
        self.nodes[node_id].cut = False

    def drain(self, node_id: str, *, limit: float = 60.0) -> None:
        """A graceful drain as ``NodeRunner.shutdown`` does it, with the waiting stepped: stop
        claiming, hand leadership over, give unstarted work back, let running work finish."""
        node = self.nodes[node_id]
        runner = node.runner
        runner.hand_over()
        runner._apply_term_events()
        runner.executor.release_unstarted()
        node.loops = [loop for loop in node.loops if loop.name != "election"]
        self.advance_until(runner.executor.idle, limit=limit)
        SchedulerNode.objects.filter(node_id=node_id).update(
            status=NodeStatus.STOPPED, running_count=0
        )
        node.alive = False

    def leader(self) -> str | None:
        """The node that leads (holds the lease and has recorded its term), if any."""
        leaders = [n.node_id for n in self.nodes.values() if n.alive and n.runner.is_leader]
        assert len(leaders) <= 1, f"two leaders at once: {leaders}"
        return leaders[0] if leaders else None

    # --- jobs ---------------------------------------------------------------------------------------
    def patch_time(self, monkeypatch: Any) -> SimCluster:
        """Make Django's ``timezone.now`` (services, rows' auto-set times) read the sim clock."""
        monkeypatch.setattr(timezone, "now", self.now)
        return self

    def create_job(self, **fields: Any) -> Job:
        """A ``sim.work`` job (fields as the API takes them), created at the simulated now."""
        data: dict[str, Any] = {"task": "sim.work", "schedule_type": "interval"}
        if fields.get("schedule_type", "interval") == "interval":
            data["interval_seconds"] = 1
        data.update(fields)
        return job_create(data=data, by=SYSTEM, now=self.now())

    def create_manual_job(self, **fields: Any) -> Job:
        """A one-off job due in a day: it runs only when triggered (or retried) in the test."""
        return self.create_job(
            schedule_type="once", run_at=self.now() + timedelta(days=1), **fields
        )

    def starts(self, job: Job | str) -> list[Effect]:
        name = job if isinstance(job, str) else job.name
        return [effect for effect in self.effects if effect.job == name]
