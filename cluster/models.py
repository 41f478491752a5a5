"""Cluster state in the database: nodes, leadership terms, the fence, and database-backed leases."""

from __future__ import annotations

from django.db import models


class NodeStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"
    DEAD = "dead", "Dead"
    STOPPED = "stopped", "Stopped"


class SchedulerNode(models.Model):
    node_id = models.CharField(max_length=128, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    version = models.CharField(max_length=32, blank=True, default="")
    queues = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField(db_index=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    capacity = models.PositiveIntegerField(default=4)
    running_count = models.PositiveIntegerField(default=0)
    # Set by an operator (dashboard/API); the node sees it on its next heartbeat and drains.
    drain_requested = models.BooleanField(default=False)
    # The node's own timing (its --heartbeat-s and --dead-after-s): the dashboard judges the node's
    # heartbeat age against these, not against defaults another node may not share.
    heartbeat_interval_s = models.FloatField(default=0.5)
    dead_after_s = models.FloatField(default=2.0)

    class Meta:
        ordering = ["node_id"]
        indexes = [models.Index(fields=["status", "last_heartbeat"], name="node_liveness_idx")]

    def __str__(self) -> str:
        return self.node_id


class TermEndReason(models.TextChoices):
    STEPPED_DOWN = "stepped_down", "Stepped down"
    LEASE_LOST = "lease_lost", "Lease lost"
    NODE_DIED = "node_died", "Node died"
    # The leader could not reach its database and released its lease.
    UNABLE = "unable", "Database unreachable"
    # The leader's path to the database was so slow that it fell behind, and a peer's was not: it
    # handed leadership over.
    FELL_BEHIND = "fell_behind", "Fell behind"


class LeadershipTerm(models.Model):
    # Each scheduling partition has terms of its own (cluster.partitions); partition 0's leader
    # also owns the cluster-wide work (reaping, notifications, retries).
    partition = models.PositiveSmallIntegerField(default=0)
    term = models.BigIntegerField()  # = the partition's fencing token
    node_id = models.CharField(max_length=128)
    acquired_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=TermEndReason.choices, blank=True)

    class Meta:
        ordering = ["-term"]
        constraints = [
            models.UniqueConstraint(fields=["partition", "term"], name="term_unique_per_partition")
        ]

    def __str__(self) -> str:
        where = f"partition {self.partition} " if self.partition else ""
        return f"{where}term {self.term} ({self.node_id})"


class ClusterFence(models.Model):
    """The newest leadership term storage has seen. Leader writes check it inside their transaction:
    a writer whose term is older than this row is stale and must change nothing."""

    name = models.CharField(max_length=64, primary_key=True)
    term = models.BigIntegerField(default=0)
    # Who raised the fence to ``term``: the same term claimed by another holder is refused (a
    # coordination store that lost its counter could mint it twice).
    holder = models.CharField(max_length=128, blank=True, default="")
    # Every fenced transaction counts itself here and names its writer's term, on the row it has
    # locked anyway: the database's own log then shows, in commit order, which term wrote what (the
    # chaos verifier checks it), and ``writes`` tells an operator the leader is writing.
    writes = models.BigIntegerField(default=0)
    writer_term = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: term {self.term}"


class CoordinationLease(models.Model):
    """A lease or lock of the database coordination backend (leader lease, per-job locks).

    ``expires_at_ms`` is wall-clock milliseconds from the acquirer's clock; nodes are assumed to run
    NTP-synchronised clocks, and the clock-drift allowance covers the rest.
    """

    name = models.CharField(max_length=191, primary_key=True)  # 191: utf8mb4 index limit
    holder = models.CharField(max_length=128, blank=True, default="")
    token = models.CharField(max_length=64, blank=True, default="")
    term = models.BigIntegerField(default=0)
    expires_at_ms = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or '-'}"
