"""Every node's work: claim pending executions, start each at its due instant, run, record.

Claim: one transaction takes up to ``limit`` due, unclaimed executions of the node's queues and stamps
each with a fresh claim token (``jobs.executions.claim_batch``). Every later write on that execution
is conditional on the token and the status it leaves (``jobs.executions`` owns them all), so a stale
worker (one declared dead, or paused past its claim) changes nothing; and no body starts unless the
node can show its claim still holds (the self-fence, ``cluster.membership``).

Admit: shortly before the due instant, a pure decision (``cluster.admission``) on facts gathered for
the batch says Start, Skip, HandBack or Wait. ``forbid`` jobs take the job's lock (Redlock on the
Redis backend) before they start, held by a watchdog while the body runs.

Run: ``thread`` isolation runs the task in a thread of this process; ``process`` isolation in a child
process that is killed on timeout or cancel (``runners``).
"""

from cluster.executor.core import PREPARE_AHEAD_S, PREPARE_WORKERS, RECONCILE_AFTER_S, Executor
from cluster.executor.facts import due_instant
from cluster.executor.noderow import NodeRow
from cluster.executor.runners import Runner, ThreadRunner
from cluster.executor.runs import (
    REASON_BLOCKER_GONE,
    REASON_CANCELLED,
    REASON_LOCK_LOST,
    REASON_SHUT_DOWN,
    REASON_TIMEOUT,
    REASON_UNTRACKED,
    ActiveRun,
    Outcome,
)

__all__ = [
    "PREPARE_AHEAD_S",
    "PREPARE_WORKERS",
    "REASON_BLOCKER_GONE",
    "REASON_CANCELLED",
    "REASON_LOCK_LOST",
    "REASON_SHUT_DOWN",
    "REASON_TIMEOUT",
    "REASON_UNTRACKED",
    "RECONCILE_AFTER_S",
    "ActiveRun",
    "Executor",
    "NodeRow",
    "Outcome",
    "Runner",
    "ThreadRunner",
    "due_instant",
]
