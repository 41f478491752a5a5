"""Admission: may a claimed run start now? A pure decision on the facts the executor gathered.

    Start              take it: mark it running, release it at its instant
    Skip(reason)       record it skipped with the reason (a stale misfire, forbid)
    HandBack(after_s)  give it back to the queue, due again after ``after_s`` (drain: at once;
                       buffer_one waiting its turn; the lock service unable to answer)
    Wait(seconds)      look again later (the job lock is about to free, an older run goes first)

A run behind an older fire of its job that no node holds is handed back rather than kept waiting:
a claim held while waiting counts against its node's capacity, and nodes full of such claims would
never claim the older fire they all wait for.

A scheduled fire that has not started when later fires of its job are already due has misfired,
whatever its grace and whatever became of those later fires: its job's misfire policy keeps the
newest due fires (one for ``run_once`` and ``skip``, ``run_all_max`` for ``run_all``) and the older
ones are skipped as superseded (never run after a newer fire of their job). A backlog
left by an outage thus collapses as the leader's own misfire policy would have collapsed it, instead
of running one stale fire after another (a forbid job runs them one at a time and would stay as far
behind as the outage was long).

Catch-up runs are the exception. The runs ``run_all`` plans for slots missed past the grace are
released on the cluster's catch-up budget (``Facts.catch_up``: their ``run_after`` paced oldest
slot first, ``cluster.scheduler``), so they wait on purpose while the on-time fires of their job
fall due; counting those would supersede every paced run and undo the budget. A catch-up run is
superseded only by later catch-up fires of its job (a second outage while the first backlog
drains: the newest ``run_all_max`` missed slots run, as the planner would have chosen), and
``run_all_max`` already bounded them when they were planned. Their staleness counts from their
paced ``run_after`` (when they became runnable), as every run's does. Within one job the order
holds: a catch-up run whose paced instant has come goes before its job's on-time fire (forbid runs
one at a time, oldest first); a paced run not yet due holds nothing up.

The executor gathers the facts (the job lock, the blocking run and whether its node is alive, an
older run still waiting) and applies the decision through ``jobs.executions``; nothing here reads the
clock, the database or the coordination backend, so every rule is table-tested.

forbid starts a run that holds the job lock: a body holds the lock while it runs and releases it
as it ends, before its outcome is written, so holding it means no body of the job is active,
whatever the rows say — unless the previous holder's node has gone silent (frozen inside the body
past the lock's TTL, not yet declared dead): then the run waits until the cluster declares that
node gone and ends its run lost, so no successor starts beside a body still counted as running.
Without the lock, forbid skips a run only when a run known to be active
(its node renews its presence) was already running at this run's due instant and still is
FORBID_SETTLE_S later (the same run found at two looks), and its node's presence, renewed at or
after that instant, lists its body as running: a predecessor whose body has just ended but
whose outcome is not written yet
(the finisher batches its writes) is not active, and the run starts that much late instead of
being skipped. A previous run that started *after* that instant (both were late, e.g. catching up
after a failover) is waited for instead, so late runs go one after the other, and so is a run on a
node that stopped renewing (it is about to be declared dead and ended). Waiting ends at the job's
misfire grace, counted from when the run became runnable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from jobs.firing import fires_kept
from jobs.models import ConcurrencyPolicy

REASON_FORBID = "forbid: previous run still active"
REASON_MISFIRE_STALE = "misfire: not started within the grace period ({grace} s)"
REASON_LOCK_WAIT = "misfire: waited for the job lock past the grace period ({grace} s)"
SUPERSEDED_PREFIX = "misfire: superseded"
REASON_SUPERSEDED = SUPERSEDED_PREFIX + " by a later fire already due ({policy})"

# How long after its due instant a forbid run waits for a running predecessor to be recorded done
# before it is skipped (seconds).
FORBID_SETTLE_S = 0.25
# How often a waiting run looks again (seconds).
WAIT_POLL_S = 0.1
# A buffer_one run waiting for the running one is claimed again after this (seconds).
BUFFER_RECHECK_S = 0.5
# The lock service could not answer: the run goes back and is tried again after this (seconds).
LOCK_UNAVAILABLE_RETRY_S = 1.0


class Lock(enum.Enum):
    NOT_NEEDED = "not_needed"  # no lock for this policy
    HELD = "held"  # this run holds the job lock
    TAKEN = "taken"  # someone else holds it
    NOT_TRIED = "not_tried"  # not asked for: a blocker or an older fire goes first anyway
    UNAVAILABLE = "unavailable"  # the lock service could not answer


@dataclass(frozen=True)
class Blocker:
    """The latest-started other running run of the job whose node is not known to be gone."""

    started_at: float | None
    # Its node renews its presence on time: it really is active.
    certain: bool
    # Its node has stopped renewing (frozen, cut off or dead, not yet declared so): its body may
    # still be inside the task, though its job lock may have lapsed.
    silent: bool = False
    # Which run it is (a skip needs the same run found blocking at two looks).
    execution_id: int | None = None
    # When its node last listed its body as running (the node's presence; None: not listed). A
    # skip needs a listing at or after the skipped run's due instant.
    listed_at: float | None = None


@dataclass(frozen=True)
class Facts:
    policy: str
    scheduled: bool  # a fire of the schedule (misfire rules apply), not a manual run or retry
    now: float
    due: float  # when the run is to be released
    due_instant: float  # the fire's due instant (slot + spread): what forbid judges against
    runnable_since: float  # when it became runnable (max of run_after and created_at)
    grace_s: float  # the job's misfire grace
    claiming: bool  # False while the node drains
    lock: Lock = Lock.NOT_NEEDED
    blocker: Blocker | None = None
    older_waiting: bool = False  # an earlier fire of the job is due and not started
    # ... and no node holds it (handed back after an outage, or by the reaper): it must be claimed
    older_unclaimed: bool = False
    # The blocker this run's previous look found (its execution id; None: none, or no look yet).
    seen_blocker: int | None = None
    # The job's misfire policy and bound, and how many later fires of the job are already due
    # (whatever became of them): a fire still waiting when the next one falls due has misfired.
    misfire_policy: str = "run_once"
    run_all_max: int = 1
    newer_due: int = 0
    # A run_all run for a slot missed past the grace, released on the catch-up budget; and how
    # many of the later due fires counted in ``newer_due`` are catch-up fires too.
    catch_up: bool = False
    newer_catch_up_due: int = 0


@dataclass(frozen=True)
class Start:
    pass


@dataclass(frozen=True)
class Skip:
    reason: str


@dataclass(frozen=True)
class HandBack:
    after_s: float | None = None


@dataclass(frozen=True)
class Wait:
    seconds: float


Decision = Start | Skip | HandBack | Wait


def is_stale(facts: Facts) -> bool:
    """A scheduled fire runnable for longer than its misfire grace (created ahead, then its node
    and the leader went away): the scheduler's misfire policy covers the slots after it, so running
    it too would break the policy."""
    return facts.scheduled and facts.now - facts.runnable_since > facts.grace_s


def is_superseded(facts: Facts) -> bool:
    """A scheduled fire with at least as many later fires of its job already due as the policy
    keeps (waiting, running, done or skipped: the schedule moved on past it): it missed its turn,
    and the policy covers it as it covers the slots a late leader finds. Without this, a job whose
    runs go one at a time (forbid) would run every fire queued during an outage one after the
    other, each a slot late, and never catch up. A catch-up run counts only the later catch-up
    fires of its job: it waits for its turn on the budget on purpose, and the on-time fires falling
    due meanwhile do not supersede it."""
    newer = facts.newer_catch_up_due if facts.catch_up else facts.newer_due
    return facts.scheduled and newer >= fires_kept(facts.misfire_policy, facts.run_all_max)


def decided_without_the_job(facts: Facts) -> bool:
    """Settled on the run's own facts (its age, the later fires of its job), before any lock or
    blocker is looked at."""
    return is_stale(facts) or is_superseded(facts)


def waited_past_grace(facts: Facts) -> bool:
    """A run kept waiting (for the job lock, a predecessor, an older fire) longer than its misfire
    grace, at least a second, since it was due or became runnable: it is skipped."""
    return facts.now > max(facts.due, facts.runnable_since) + max(facts.grace_s, 1)


def admit(facts: Facts) -> Decision:
    if is_stale(facts):
        return Skip(REASON_MISFIRE_STALE.format(grace=_seconds(facts.grace_s)))
    if is_superseded(facts):
        return Skip(REASON_SUPERSEDED.format(policy=facts.misfire_policy))
    if not facts.claiming:
        return HandBack()
    if facts.policy not in (ConcurrencyPolicy.FORBID, ConcurrencyPolicy.BUFFER_ONE):
        return Start()
    if facts.lock == Lock.UNAVAILABLE:
        return HandBack(LOCK_UNAVAILABLE_RETRY_S)
    if facts.policy == ConcurrencyPolicy.BUFFER_ONE:
        return HandBack(BUFFER_RECHECK_S) if facts.blocker is not None else Start()
    # forbid: the job lock is the truth of whether a body of the job is active (a body holds it
    # from admission until it ends, and releases it before its outcome is written), so a run that
    # holds it starts even if a previous run's row still says running (its outcome not written
    # yet: a finisher that is behind, or a node frozen just after the body ended).
    if facts.lock == Lock.HELD and not facts.older_waiting:
        if facts.blocker is None or not facts.blocker.silent:
            return Start()
        # The lock is ours only because the previous holder stopped extending it: its node went
        # silent, perhaps frozen inside the body. Starting now would run beside a body the cluster
        # has not given up on; wait until it does (the node is declared gone and the run ended
        # lost, recorded as indeterminate) or the node speaks again.
        if waited_past_grace(facts):
            return Skip(REASON_LOCK_WAIT.format(grace=_seconds(facts.grace_s)))
        return Wait(WAIT_POLL_S)
    blocker = facts.blocker
    if (
        blocker is not None
        # The lock was asked for and someone holds it: a row alone (the lock not tried because
        # an older fire goes first) says nothing of whether that body is still on.
        and facts.lock == Lock.TAKEN
        and blocker.certain
        and blocker.started_at is not None
        and blocker.started_at <= facts.due_instant
        and facts.now >= facts.due
    ):
        settled_at = facts.due + FORBID_SETTLE_S
        if facts.now < settled_at:
            return Wait(max(0.001, min(WAIT_POLL_S, settled_at - facts.now)))
        if (
            facts.seen_blocker is not None
            and facts.seen_blocker == blocker.execution_id
            and blocker.listed_at is not None
            and blocker.listed_at >= facts.due_instant
        ):
            return Skip(REASON_FORBID)
        # The same run must be found blocking at two looks: the lock taken may be a newer run's
        # that had not yet marked its row running when the blockers were read, while the latest
        # row found is an older run whose outcome is not written yet (a database outage; the
        # chaos run found two such skips). Look again: the next look finds the newer run, which
        # started after this run's instant, and waits for it. And the body must be listed as
        # running by its own node at or after this run's instant (its presence, renewed every
        # heartbeat): a lock released late and a row written late (a slow path of the holder's
        # node, a finisher behind) both look like a live body at two looks (a chaos run found
        # five such skips); a body its node lists after the instant was running at it.
        if waited_past_grace(facts):
            return Skip(REASON_LOCK_WAIT.format(grace=_seconds(facts.grace_s)))
        return Wait(WAIT_POLL_S)
    if waited_past_grace(facts):
        return Skip(REASON_LOCK_WAIT.format(grace=_seconds(facts.grace_s)))
    if facts.older_waiting and facts.older_unclaimed:
        # Waiting here would hold a claim, and so capacity, for a run that cannot go before one
        # nobody holds: with every node full of such runs, the older fire is never claimed
        # (found by the chaos run after a database outage). Give it back as it was (its run_after
        # unchanged, so fires are claimed again in their order, oldest first).
        return HandBack()
    if facts.now < facts.due:
        return Wait(max(0.001, min(WAIT_POLL_S, facts.due - facts.now)))
    return Wait(WAIT_POLL_S)


def _seconds(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
