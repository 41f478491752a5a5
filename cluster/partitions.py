"""Scheduling partitions: each has a lease, terms and a fence of its own, and any node may lead it.

The jobs are split into P partitions (``jobs.partitioning``: which job is in which, and P). A
partition's leader fires its jobs exactly as a single leader fires all of them: it holds the
partition's lease (``lease_name``), records its term (``LeadershipTerm`` rows of that partition)
after raising the partition's fence row (``fence_name``), and writes its fires inside
``fenced_transaction(term, fence=...)``. Partition 0 keeps the names a single leader always had,
so with P = 1 nothing differs from one leader. Partition 0's leader is also the cluster's leader:
it alone does what is cluster-wide (reaping dead nodes, notifications, promoting retries, moving
jobs whose partition is out of range, the "behind" watch).

Balance: a node takes partitions while it leads fewer than its share (``share``: P over the nodes
able to lead, rounded up) and hands the extras back when it leads more (a node joined: all of
them at once, as far as the others have room, ``hand_back_count``) or one when it leads more than
the floor of P over the nodes while another leads fewer (``gives_back``; each node's presence says
which partitions it leads). A partition nobody has
taken for ``ORPHAN_AFTER_S`` is taken by any able node whatever its share, so a miscount (a node
counted able that cannot lead) never leaves one unled.
"""

from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass, field

from cluster.coordination import Lease
from cluster.elector import LeaderElector

LEADER_LEASE = "scheduler-leader"
LEADER_FENCE = "leader"
# A node that leads more than its share gives one partition back at most this often (seconds):
# the node it goes to has time to take it before the next is given.
HAND_BACK_EVERY_S = 2.0
# A partition whose lease has been free this long is taken by any node able to lead it, whatever
# its share (two looks a retry period apart): a leader lost to a fault is replaced at lease speed
# even when every other node leads its share already (a chaos run saw 5.2 s without a leader of
# one partition with 3 s here).
ORPHAN_AFTER_S = 0.5


def lease_name(partition: int) -> str:
    return LEADER_LEASE if partition == 0 else f"{LEADER_LEASE}-p{partition}"


def fence_name(partition: int) -> str:
    return LEADER_FENCE if partition == 0 else f"{LEADER_FENCE}-p{partition}"


def partition_of_fence(name: str) -> int | None:
    """Which partition a fence row belongs to (None: not a partition's fence)."""
    if name == LEADER_FENCE:
        return 0
    head, _, number = name.rpartition("-p")
    return int(number) if head == LEADER_FENCE and number.isdigit() else None


def share(total: int, able_nodes: int) -> int:
    """How many of ``total`` partitions one of ``able_nodes`` nodes should lead (rounded up: the
    shares cover every partition)."""
    return math.ceil(total / max(1, able_nodes))


def gives_back(held: int, total: int, able_nodes: int, fewest_other: int | None) -> bool:
    """Whether a node leading ``held`` partitions should give one back: another able node has
    room for it (it leads fewer than its share), and this one leads more than its share, or more
    than the fair floor while that other leads fewer than the floor (4 partitions on 3 nodes
    settle as 2, 1, 1, never 2, 2, 0). Without a taker in view it keeps what it leads."""
    quota = share(total, able_nodes)
    if fewest_other is None or fewest_other >= quota:
        return False
    if held > quota:
        return True
    floor = total // max(1, able_nodes)
    return held > floor and fewest_other < floor


def hand_back_count(held: int, total: int, able_nodes: int, room: int) -> int:
    """How many partitions a node that gives back (``gives_back``) hands over at once: all it
    leads beyond its share, as far as the other able nodes have ``room`` for them (their shares
    less what they lead), so a node joining a cluster, or a cluster starting with its nodes a
    few seconds apart, is balanced in one step rather than one partition every
    HAND_BACK_EVERY_S; one at a time otherwise (the floor rule's small moves)."""
    over = held - share(total, able_nodes)
    return max(1, min(over, room)) if over > 0 else 1


def label(partition: int, total: int) -> str:
    """How logs name a partition's leadership: nothing more than before with one partition."""
    return "" if total <= 1 else f" partition {partition}"


@dataclass
class Seat:
    """One partition's leadership as one node sees it: its elector, whether its term is recorded
    (``leading``), and the elector's start/stop events waiting for the leader loop to record them
    (the database work of a term never runs in the election thread)."""

    partition: int
    elector: LeaderElector
    leading: threading.Event = field(default_factory=threading.Event)
    term: int | None = None
    ended_term: int | None = None
    events: queue.Queue[tuple[str, Lease, str]] = field(default_factory=queue.Queue)
    # Balance: when this node first saw the partition's lease free while it was not campaigning.
    free_since: float | None = None
    looked_at: float = float("-inf")
    # The leader loop: when this partition's next pass is due (monotonic).
    next_pass_at: float = 0.0
    # Set by the election loop (this node leads more than its share): the leader loop releases
    # the lease after its pass.
    give_back: bool = False

    @property
    def is_leader(self) -> bool:
        return self.leading.is_set() and self.elector.is_leader

    @property
    def holds_lease(self) -> bool:
        return self.elector.lease is not None
