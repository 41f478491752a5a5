"""The leader's reaper: the work of nodes that can no longer do it goes back to the cluster.

Nodes whose presence expired (and whose row is as silent) are dead: their running runs are lost
(retried per policy), their claimed, unstarted ones go back to the queue. Nodes alive in the
coordination store but cut off from the database say so in their presence; past the dead threshold
their work claimed before the cut is taken the same way, conditional on their row not having
been written since. A run still running past its timeout plus the dead threshold is timed out.
Everything here runs in the leader's fenced transaction: a stale leader reaps nothing.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cluster import services
from cluster.fencing import fenced_transaction
from cluster.models import NodeStatus, SchedulerNode
from jobs import executions
from jobs.models import JobExecution
from jobs.states import ExecutionStatus

REASON_NODE_DIED = "node {node} stopped heartbeating"
REASON_NODE_STOPPED = "node {node} stopped without finishing the run"
REASON_STUCK = "running past its timeout plus the dead threshold"
REASON_NODE_CUT_OFF = (
    "node {node} could not reach the database for {seconds:.0f} s; its outcome was never recorded"
)


@dataclass
class ReapResult:
    dead_nodes: list[str] = field(default_factory=list)
    lost: int = 0
    unclaimed: int = 0
    stuck: int = 0
    # Nodes alive in the coordination store but cut off from the database whose work was taken.
    cut_off_nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CutOff:
    """What a node alive in the coordination store but cut off from its database says in its
    presence: since when (the cluster's reference time), the runs whose bodies it still runs
    (left alone: a body cannot be stopped from here) and the runs it made active but never
    started (handed back, not lost)."""

    since: datetime
    bodies: frozenset[int] = frozenset()
    unstarted: frozenset[int] = frozenset()


def read_cut_off(
    presences: dict[str, dict[str, object]],
    *,
    now: datetime,
    after: timedelta,
    itself: str | None = None,
) -> dict[str, CutOff]:
    """The live nodes whose presence says they have not reached the database for ``after``
    (payloads as ``backend.live_nodes()`` returns them; a malformed one is ignored). ``itself``,
    the node reading (a leader reaching its database now), is never among them: its presence may
    still say what it wrote before the database came back, and a chaos run's leader, elected the
    moment it answered again, ended its own runs lost while their admissions were starting them."""
    found: dict[str, CutOff] = {}
    for node_id, payload in presences.items():
        if node_id == itself or payload.get("database") != "unreachable":
            continue
        try:
            since_ms = float(payload["database_since_ms"])  # type: ignore[arg-type]
            bodies = frozenset(int(pk) for pk in payload.get("bodies") or ())  # type: ignore[union-attr]
            unstarted = frozenset(int(pk) for pk in payload.get("unstarted") or ())  # type: ignore[union-attr]
        except (KeyError, TypeError, ValueError):
            continue
        since = datetime.fromtimestamp(since_ms / 1000, tz=now.tzinfo)
        if now - since >= after:
            found[node_id] = CutOff(since, bodies, unstarted)
    return found


def _take_cut_off_work(
    cut_off: dict[str, CutOff], *, now: datetime, cutoff: datetime, result: ReapResult
) -> None:
    """(Inside the fenced transaction.) The work of nodes cut off from the database, claimed before
    the cut: claims go back to the queue, runs whose bodies are not running end lost (retried per
    policy), runs never started go back to the queue. Only while the node's row has not been
    written since ``cutoff`` (locked, so a node that answers again and heartbeats first keeps its
    work; one whose heartbeat waits on this lock finds its stale runs taken, fenced by their claim
    tokens). Runs claimed after the outage began are not touched."""
    stale = services.nodes_lock_silent(node_ids=list(cut_off), silent_before=cutoff)
    for node_id in sorted(stale):
        said = cut_off[node_id]
        seconds = (now - said.since).total_seconds()
        reason = REASON_NODE_CUT_OFF.format(node=node_id, seconds=seconds)
        unclaimed = executions.hand_back_claims(node=node_id, claimed_before=said.since)
        lost = 0
        running = list(
            JobExecution.objects.select_related("job")
            .filter(node=node_id, claimed_at__lt=said.since, status=ExecutionStatus.RUNNING)
            .exclude(pk__in=list(said.bodies))
            .order_by("pk")
        )
        for execution in running:
            if execution.pk in said.unstarted:
                unclaimed += executions.hand_back_unstarted(execution)
            elif executions.declare_lost(execution, reason=reason, now=now):
                lost += 1
        if unclaimed or lost:
            result.cut_off_nodes.append(node_id)
            result.unclaimed += unclaimed
            result.lost += lost


def reap_dead_nodes(
    *,
    term: int,
    now: datetime,
    dead_after: timedelta,
    live: Collection[str],
    cut_off: dict[str, CutOff] | None = None,
) -> ReapResult:
    """Mark dead the nodes whose presence has expired (not in ``live``, the coordination backend's
    answer) and whose heartbeat row is as old; their running work becomes lost (and is retried per
    policy), their claimed-but-unstarted work goes back to the queue. Also times out runs stuck past
    timeout + dead threshold on any node, and takes the work of live nodes ``cut_off`` from the
    database (``read_cut_off``): alive, they keep their rows; unable to record, not their runs.

    A node only starts work while it can show its presence has not expired (cluster/membership.py),
    so work taken here can no longer start there. The row's age is a second condition, never the
    only one: a coordination store that lost every key (a Redis restart) must not kill live nodes.
    """
    result = ReapResult()
    cutoff = now - dead_after
    silent = SchedulerNode.objects.filter(
        status__in=[NodeStatus.ACTIVE, NodeStatus.DRAINING], last_heartbeat__lt=cutoff
    ).exclude(node_id__in=list(live))
    stuck_candidates = JobExecution.objects.filter(
        status=ExecutionStatus.RUNNING, job__timeout_seconds__isnull=False
    )
    # A node that stopped (drained) must have left nothing behind; if it did (a crash at the very
    # end of a drain), its leftovers are treated like a dead node's.
    stopped_nodes = SchedulerNode.objects.filter(status=NodeStatus.STOPPED).values("node_id")
    orphans = JobExecution.objects.filter(
        status__in=[ExecutionStatus.RUNNING, ExecutionStatus.PENDING],
        claim_token__isnull=False,
        node__in=stopped_nodes,
    )
    if not (cut_off or silent.exists() or stuck_candidates.exists() or orphans.exists()):
        return result
    with fenced_transaction(term):
        if cut_off:
            _take_cut_off_work(cut_off, now=now, cutoff=cutoff, result=result)
        dead = services.nodes_declare_dead(
            node_ids=list(silent.values_list("node_id", flat=True)), silent_before=cutoff
        )
        stopped_with_work = list(orphans.values_list("node", flat=True).distinct())
        result.dead_nodes = dead
        gone = [*dead, *stopped_with_work]
        if gone:
            running = list(
                JobExecution.objects.select_related("job")
                .filter(node__in=gone, status=ExecutionStatus.RUNNING)
                .order_by("pk")  # not the default (by slot): MariaDB walked the table for it
            )
            for execution in running:
                reason = REASON_NODE_DIED if execution.node in dead else REASON_NODE_STOPPED
                if executions.declare_lost(
                    execution, reason=reason.format(node=execution.node), now=now
                ):
                    result.lost += 1
            result.unclaimed += executions.hand_back_nodes(gone)
        stuck = list(
            JobExecution.objects.select_related("job")
            .filter(status=ExecutionStatus.RUNNING, job__timeout_seconds__isnull=False)
            .order_by("pk")
        )
        for execution in stuck:
            limit = timedelta(seconds=execution.job.timeout_seconds) + dead_after
            if execution.started_at and now - execution.started_at > limit:
                if executions.end_running(
                    execution, status=ExecutionStatus.TIMED_OUT, reason=REASON_STUCK, now=now
                ):
                    result.stuck += 1
    return result
