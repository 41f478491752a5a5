"""The fault kinds of the chaos verifier and what each does to the cluster: the nemesis deals them,
the checker judges a history by them. Plain data (no Django): a saved history can be checked
anywhere."""

from __future__ import annotations

SIGKILL_LEADER = "sigkill_leader"
SIGKILL_WORKER = "sigkill_worker"
SIGSTOP_LEADER = "sigstop_leader"
SIGSTOP_WORKER = "sigstop_worker"
SIGTERM_LEADER = "sigterm_leader"
SIGTERM_WORKER = "sigterm_worker"
PARTITION_DB_LEADER = "partition_db_leader"
PARTITION_DB_WORKER = "partition_db_worker"
PARTITION_REDIS_LEADER = "partition_redis_leader"
PARTITION_REDIS_WORKER = "partition_redis_worker"
PARTITION_BOTH_LEADER = "partition_both_leader"
PARTITION_BOTH_WORKER = "partition_both_worker"
ONEWAY_DB_LEADER = "oneway_db_leader"  # the leader's requests reach the database, answers do not
ONEWAY_REDIS_LEADER = "oneway_redis_leader"
SLOW_DB_LEADER = "slow_db_leader"
SLOW_REDIS_LEADER = "slow_redis_leader"
# A fault meant for the leader lands on a worker when no node leads at that instant, and is logged
# with the role its target really had: the same cut or slow link, on a worker.
ONEWAY_DB_WORKER = "oneway_db_worker"
ONEWAY_REDIS_WORKER = "oneway_redis_worker"
SLOW_DB_WORKER = "slow_db_worker"
SLOW_REDIS_WORKER = "slow_redis_worker"
DB_DOWN = "db_down"  # the database refuses every node at once (connections reset)
MARIADB_RESTART = "mariadb_restart"  # the private MariaDB SIGKILLed, then started again
REDIS_RESTART = "redis_restart"  # the coordination Redis restarted empty
REDIS_FREEZE = "redis_freeze"  # the coordination Redis stopped (SIGSTOP), then resumed
REDLOCK_MASTER_DOWN = "redlock_master_down"  # one of the three Redlock masters killed a while
CLOCK_JUMP = "clock_jump"  # one node's wall clock stepped by several seconds, then back
TWO_DOWN = "two_down"  # the leader and a worker SIGKILLed at the same instant
KILL_IN_RECOVERY = "kill_in_recovery"  # the leader SIGKILLed, then its successor as it takes over
CLUSTER_RESTART = "cluster_restart"  # every node stopped (SIGTERM), then all started again

NODE_FAULT_KINDS = (
    SIGKILL_LEADER,
    SIGKILL_WORKER,
    SIGSTOP_LEADER,
    SIGSTOP_WORKER,
    SIGTERM_LEADER,
    SIGTERM_WORKER,
)
OVERLAP_KINDS = (TWO_DOWN, KILL_IN_RECOVERY, CLUSTER_RESTART)
DB_LINK_KINDS = (
    PARTITION_DB_LEADER,
    PARTITION_DB_WORKER,
    ONEWAY_DB_LEADER,
    SLOW_DB_LEADER,
    DB_DOWN,
)
REDIS_LINK_KINDS = (
    PARTITION_REDIS_LEADER,
    PARTITION_REDIS_WORKER,
    ONEWAY_REDIS_LEADER,
    SLOW_REDIS_LEADER,
)
BOTH_LINK_KINDS = (PARTITION_BOTH_LEADER, PARTITION_BOTH_WORKER)
REDIS_FAULT_KINDS = (REDIS_RESTART, REDIS_FREEZE, REDLOCK_MASTER_DOWN)
PARTITION_KINDS = frozenset(
    {
        PARTITION_DB_LEADER,
        PARTITION_DB_WORKER,
        PARTITION_REDIS_LEADER,
        PARTITION_REDIS_WORKER,
        PARTITION_BOTH_LEADER,
        PARTITION_BOTH_WORKER,
        ONEWAY_DB_LEADER,
        ONEWAY_REDIS_LEADER,
        ONEWAY_DB_WORKER,
        ONEWAY_REDIS_WORKER,
    }
)
SLOW_KINDS = frozenset({SLOW_DB_LEADER, SLOW_REDIS_LEADER, SLOW_DB_WORKER, SLOW_REDIS_WORKER})

# A process killed: a body of that pid with no end line ended there.
KILL_FAULTS = frozenset({SIGKILL_LEADER, SIGKILL_WORKER, TWO_DOWN, KILL_IN_RECOVERY})
FREEZE_FAULTS = frozenset({SIGSTOP_LEADER, SIGSTOP_WORKER})
# A node stopped gracefully (drained: running work finished or handed back as lost).
STOP_FAULTS = frozenset({SIGTERM_LEADER, SIGTERM_WORKER, CLUSTER_RESTART})
# Faults that take their node's work (and its leadership, if it leads) away at their start.
NODE_FAULTS = KILL_FAULTS | FREEZE_FAULTS | STOP_FAULTS | PARTITION_KINDS
# Faults that leave every node without its database or its coordination store for their length:
# no leader can be elected, no outcome written, until a while after they end.
OUTAGE_FAULTS = frozenset({DB_DOWN, MARIADB_RESTART, REDIS_RESTART, REDIS_FREEZE, CLUSTER_RESTART})
# Faults after which a run on the target node (or, for an outage, on any node) may rightly be
# declared lost: its node was killed, frozen, stopped, cut off or slowed past its presence.
LOSS_FAULTS = NODE_FAULTS | OUTAGE_FAULTS | SLOW_KINDS | {REDLOCK_MASTER_DOWN}

# How long after a fault the cluster must be running every job again (seconds, on top of the
# job's interval): a lease for the next leader to take over, and a margin for reconnects and a
# loaded machine; an outage's bound counts from its end; the fault inside a recovery needs two
# takeovers; a restarted cluster starts its processes first.
RECOVERY_MARGIN_S = 1.5
STARTUP_S = 5.0


def recovery_bound_s(kind: str, *, lease_ttl_s: float) -> float:
    """The longest a fault of ``kind`` may keep a job from running beyond its interval, counted
    from the fault's start, or from its end for an outage (the runner also counts a SIGSTOP as
    one on SQLite, where a frozen writer holds the database-wide lock)."""
    bound = lease_ttl_s + RECOVERY_MARGIN_S
    if kind == KILL_IN_RECOVERY:
        bound += lease_ttl_s
    if kind == CLUSTER_RESTART:
        bound += STARTUP_S
    return bound
