"""Jobs, their executions and the audit trail (docs/jobs.md, docs/security.md).

Validation of a job's fields lives in ``jobs.validation`` and is run by the services, the API and the
admin alike; the database adds check and unique constraints as the last line of defence.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.states import ExecutionStatus

# Upper bounds of numeric job fields: large enough for any real use, small enough to catch typos and
# overflow ("absurd numbers"). Shared with validation and the API schema.
MAX_INTERVAL_S = 366 * 24 * 3600
MAX_TIMEOUT_S = 7 * 24 * 3600
# Flow control bounds (jobs.flow): a limit's count, and a rate limit's period (a day).
MAX_FLOW_LIMIT = 100_000
MAX_RATE_PERIOD_S = 86_400
MAX_RETRIES = 100
MAX_BACKOFF_S = 7 * 24 * 3600
MAX_GRACE_S = 7 * 24 * 3600
MAX_SPREAD_S = 24 * 3600
MAX_RUN_ALL_CATCHUP = 1000
MAX_PRIORITY = 1000
MAX_OUTPUT_CHARS = 64 * 1024


class ScheduleType(models.TextChoices):
    CRON = "cron", "Cron"
    INTERVAL = "interval", "Interval"
    ONCE = "once", "Once"


class MisfirePolicy(models.TextChoices):
    RUN_ONCE = "run_once", "Run once"
    SKIP = "skip", "Skip"
    RUN_ALL = "run_all", "Run all (bounded)"


class DstRepeated(models.TextChoices):
    """A cron job's wall time that happens twice (the clocks go back): when it fires."""

    CRON = "cron", "As cron does (once for a fixed hour, both times for a wildcard hour)"
    FIRST = "first", "Once, the first time"
    LAST = "last", "Once, the second time"
    BOTH = "both", "Both times"


class DstMissing(models.TextChoices):
    """A cron job's wall time that does not happen (the clocks go forward): what it does."""

    CRON = "cron", "As cron does (shift a fixed hour, skip a wildcard hour)"
    SHIFT = "shift", "Fire once just after the change"
    SKIP = "skip", "Do not fire"


class ConcurrencyPolicy(models.TextChoices):
    FORBID = "forbid", "Forbid"
    BUFFER_ONE = "buffer_one", "Buffer one"
    REPLACE = "replace", "Replace"
    ALLOW = "allow", "Allow"


class Isolation(models.TextChoices):
    THREAD = "thread", "Thread (fast; a hung task can only be abandoned)"
    PROCESS = "process", "Process (a hung or cancelled task is killed)"


class Trigger(models.TextChoices):
    SCHEDULE = "schedule", "Schedule"
    MANUAL = "manual", "Manual"
    RETRY = "retry", "Retry"
    API = "api", "API"
    # One of many runs submitted together through the enqueue API, each with arguments of its own.
    ENQUEUE = "enqueue", "Enqueued"
    # Made by another run's final outcome: a job's on_success, on_failure or on_end (jobs.chains).
    CHAIN = "chain", "Chain"


class SchedulerSetting(models.Model):
    """A value every process must agree on, kept in the database rather than in each process's
    settings: ``partitions`` (how many scheduling partitions the jobs are split into;
    jobs.partitioning)."""

    name = models.CharField(max_length=64, primary_key=True)
    value = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"


class Job(models.Model):
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True, default="")
    task = models.CharField(max_length=200)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)

    schedule_type = models.CharField(max_length=16, choices=ScheduleType.choices)
    cron_expression = models.CharField(max_length=200, blank=True, default="")
    timezone = models.CharField(max_length=64, default="UTC")
    # What a cron job does on the days its time zone changes offset (jobs.schedules).
    dst_repeated = models.CharField(max_length=8, choices=DstRepeated.choices, default="cron")
    dst_missing = models.CharField(max_length=8, choices=DstMissing.choices, default="cron")
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    # Interval slots are start_at + k * interval; with no start_at they are aligned to the Unix epoch.
    start_at = models.DateTimeField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)

    enabled = models.BooleanField(default=True)
    # When the next fire is due: its slot plus the job's spread offset (jobs.firing); NULL when the
    # schedule has no further fire or the job is paused.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fire_at = models.DateTimeField(null=True, blank=True)

    misfire_policy = models.CharField(
        max_length=16, choices=MisfirePolicy.choices, default=MisfirePolicy.RUN_ONCE
    )
    misfire_grace_seconds = models.PositiveIntegerField(default=60)
    run_all_max = models.PositiveIntegerField(default=10)
    concurrency_policy = models.CharField(
        max_length=16, choices=ConcurrencyPolicy.choices, default=ConcurrencyPolicy.FORBID
    )
    # Flow control across the cluster (jobs.flow): at most this many runs of the job at once (NULL:
    # no bound beyond the concurrency policy), and at most ``rate_limit`` starts in any
    # ``rate_period_seconds``. A run held back by either waits (handed back with the reason).
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_period_seconds = models.PositiveIntegerField(default=60)

    max_retries = models.PositiveIntegerField(default=0)
    retry_backoff_base = models.FloatField(default=1.0)  # seconds before the first retry
    retry_backoff_factor = models.FloatField(default=2.0)
    retry_backoff_max = models.FloatField(default=300.0)  # seconds, cap of one delay
    retry_jitter = models.BooleanField(default=True)

    timeout_seconds = models.PositiveIntegerField(null=True, blank=True)
    isolation = models.CharField(max_length=16, choices=Isolation.choices, default=Isolation.THREAD)
    priority = models.IntegerField(default=0)
    queue = models.CharField(max_length=64, default="default")
    spread_seconds = models.PositiveIntegerField(default=0)
    # Labels an operator filters and acts on jobs by (jobs.validation: lower-case, at most 20).
    tags = models.JSONField(default=list, blank=True)
    # Which scheduling partition fires this job (cluster.partitions: a stable function of its
    # name, below the cluster's partition count); 0 with one partition.
    partition = models.PositiveSmallIntegerField(default=0)
    # Jobs run when one of this job's runs ends for good (jobs.chains): by name, as definitions
    # are exported and applied; the names are checked to exist and to make no cycle when written.
    on_success = models.JSONField(default=list, blank=True)
    on_failure = models.JSONField(default=list, blank=True)
    on_end = models.JSONField(default=list, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Optimistic lock: every update is conditional on the version the editor read.
    version = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["name"]
        indexes = [
            # The scheduler asks "which enabled jobs are due": this index answers without a scan.
            models.Index(fields=["enabled", "next_fire_at"], name="job_due_idx"),
            # A partition's leader asks the same of its own jobs.
            models.Index(fields=["partition", "enabled", "next_fire_at"], name="job_part_due_idx"),
            models.Index(fields=["task"], name="job_task_idx"),
            models.Index(fields=["updated_at"], name="job_updated_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                name="job_schedule_fields",
                condition=(
                    Q(schedule_type="cron") & ~Q(cron_expression="")
                    # NULL compares as unknown and a CHECK passes on unknown: test IS NOT NULL.
                    | Q(
                        schedule_type="interval",
                        interval_seconds__isnull=False,
                        interval_seconds__gt=0,
                    )
                    | Q(schedule_type="once", run_at__isnull=False)
                ),
            ),
            models.CheckConstraint(
                name="job_timeout_positive",
                condition=Q(timeout_seconds__isnull=True) | Q(timeout_seconds__gt=0),
            ),
            models.CheckConstraint(
                name="job_backoff_nonnegative",
                condition=Q(retry_backoff_base__gte=0)
                & Q(retry_backoff_factor__gte=1)
                & Q(retry_backoff_max__gte=0),
            ),
            models.CheckConstraint(name="job_version_positive", condition=Q(version__gte=1)),
            models.CheckConstraint(
                name="job_flow_positive",
                condition=(Q(max_concurrent__isnull=True) | Q(max_concurrent__gte=1))
                & (Q(rate_limit__isnull=True) | Q(rate_limit__gte=1))
                & Q(rate_period_seconds__gte=1),
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Queue(models.Model):
    """A queue's flow control, shared by every node (jobs.flow). A queue has no row until an
    operator sets something on it: a queue without one has no limit and is not paused."""

    name = models.CharField(max_length=64, primary_key=True)
    # At most this many runs of the queue's jobs at once across the cluster (NULL: no bound).
    max_concurrent = models.PositiveIntegerField(null=True, blank=True)
    # At most ``rate_limit`` runs of the queue start in any ``rate_period_seconds`` (NULL: none).
    rate_limit = models.PositiveIntegerField(null=True, blank=True)
    rate_period_seconds = models.PositiveIntegerField(default=60)
    # A paused queue's runs are not claimed; they wait, and the misfire policy applies on resume.
    paused = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                name="queue_flow_positive",
                condition=(Q(max_concurrent__isnull=True) | Q(max_concurrent__gte=1))
                & (Q(rate_limit__isnull=True) | Q(rate_limit__gte=1))
                & Q(rate_period_seconds__gte=1),
            ),
        ]

    def __str__(self) -> str:
        return self.name


class FlowPermit(models.Model):
    """One start of a rate-limited job or queue, at the instant it was released: the sliding
    window a rate limit counts (jobs.flow). ``key`` is "job:<id>" or "queue:<name>". Kept for
    PERMITS_KEPT_S after the instant, so the count can be checked afterwards."""

    key = models.CharField(max_length=80)
    released_at = models.DateTimeField()
    execution_id = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["key", "released_at"], name="flow_permit_window_idx")]

    def __str__(self) -> str:
        return f"{self.key} @ {self.released_at.isoformat()}"


class ExecutionQuerySet(models.QuerySet):
    def update(self, **kwargs: object) -> int:
        # Every write stamps updated_at, so readers (the dashboard) can ask "what changed since".
        kwargs.setdefault("updated_at", timezone.now())
        return super().update(**kwargs)


# The order of every list of runs: the newest fire slot first, a retry before its first attempt.
# Served by an index whatever the filter (see JobExecution.Meta.indexes); the id breaks ties.
RECENT_FIRST = ("-scheduled_for", "-attempt", "-id")


class JobExecution(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="executions")
    scheduled_for = models.DateTimeField()  # the fire slot
    attempt = models.PositiveIntegerField(default=1)
    trigger = models.CharField(max_length=16, choices=Trigger.choices, default=Trigger.SCHEDULE)
    status = models.CharField(
        max_length=16, choices=ExecutionStatus.choices, default=ExecutionStatus.PENDING
    )
    # Not to be started before this instant (spread offset, retry backoff, hand-out ahead of time).
    run_after = models.DateTimeField()
    queue = models.CharField(max_length=64, default="default")
    priority = models.IntegerField(default=0)

    term = models.BigIntegerField(null=True, blank=True)  # leader term that created it
    node = models.CharField(max_length=128, blank=True, default="")
    # NULL (not "") means unclaimed: a claim is "UPDATE ... WHERE claim_token IS NULL".
    claim_token = models.CharField(max_length=64, null=True, blank=True)  # noqa: DJ001
    cancel_requested = models.BooleanField(default=False)
    # A run_all fire the leader wrote for a slot missed past its grace, released on the catch-up
    # budget (its run_after is paced, not its due instant): on-time fires do not supersede it.
    # A default in the database too: a writer that lists its columns (an INSERT of its own)
    # writes an ordinary run.
    catch_up = models.BooleanField(default=False, db_default=False)
    reason = models.CharField(max_length=255, blank=True, default="")  # why skipped/lost/cancelled
    triggered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # A scheduled fire carries the instant its tick decided at (the leader's reference time, the
    # same one its misfire decision used); any other row, the time it was made.
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    updated_at = models.DateTimeField(auto_now=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)

    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    output = models.TextField(blank=True, default="")  # bounded to MAX_OUTPUT_CHARS by the writer
    # This run's own arguments (an enqueued run, and its retries); NULL means the job's.
    args = models.JSONField(null=True, blank=True)
    kwargs = models.JSONField(null=True, blank=True)
    # The caller's key for an enqueued run (unique per job): enqueueing the same key again returns
    # the run it made, not a second one. NULL for every other row (retries do not carry it).
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The run whose final outcome made this one (a chained run, jobs.chains); NULL for every other
    # row, the chained run's retries included (they are linked to it by their fire slot).
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="chained_runs"
    )

    objects = ExecutionQuerySet.as_manager()

    class Meta:
        ordering = ["-scheduled_for", "-attempt"]
        constraints = [
            # The last line of defence against a duplicate fire.
            models.UniqueConstraint(
                fields=["job", "scheduled_for", "attempt"], name="execution_unique_fire"
            ),
            models.CheckConstraint(name="execution_attempt_positive", condition=Q(attempt__gte=1)),
            # Several NULLs are distinct in a unique index (MariaDB and SQLite alike).
            models.UniqueConstraint(
                fields=["job", "idempotency_key"], name="execution_unique_idempotency_key"
            ),
            # A run's outcome makes at most one run of each job it chains to, however often that
            # outcome is written (a finisher's batch tried again, a reaper and a late finisher).
            models.UniqueConstraint(fields=["job", "parent"], name="execution_unique_chain"),
        ]
        indexes = [
            # The claim's own range (unclaimed pending rows of a queue) in its own order (priority
            # first, then due time): a claim reads only the rows it takes, neither the whole
            # backlog it would sort nor the rows already claimed ahead of their instant. Every
            # index with status in it changes with every run's every step (insert, claim,
            # outcome): there is no other (an index on status, queue and run_after cost MariaDB
            # 12% of its time in W2; retries due and late runs are found through this one).
            models.Index(
                fields=["status", "queue", "claim_token", "-priority", "run_after", "id"],
                name="execution_unclaimed_idx",
            ),
            models.Index(fields=["status", "node"], name="execution_node_idx"),
            # Lists of runs, newest fire slot first (RECENT_FIRST), read only what they show: all
            # runs through this index, one job's through execution_unique_fire. Neither column
            # changes after the insert, so no write but the insert (and a purge) touches it.
            models.Index(fields=["scheduled_for", "attempt"], name="execution_slot_idx"),
            models.Index(fields=["job", "status"], name="execution_job_status_idx"),
            models.Index(fields=["created_at"], name="execution_created_idx"),
            models.Index(fields=["updated_at"], name="execution_updated_idx"),
            models.Index(fields=["finished_at"], name="execution_finished_idx"),
            models.Index(fields=["status", "finished_at"], name="execution_outcome_idx"),
        ]

    def __str__(self) -> str:
        """What a person reads (the audit log, the admin): "nightly-report run #12", with the
        attempt when it is a retry. The job's name only if it is loaded (no query for a label)."""
        job = self.job.name if JobExecution.job.is_cached(self) else f"job {self.job_id}"
        retry = f" (attempt {self.attempt})" if self.attempt and self.attempt > 1 else ""
        return f"{job} run #{self.pk}{retry}"

    def call_arguments(self) -> tuple[list, dict]:
        """The arguments this run's task is called with: its own, else its job's (copies)."""
        args = self.args if self.args is not None else self.job.args
        kwargs = self.kwargs if self.kwargs is not None else self.job.kwargs
        return list(args), dict(kwargs)


class AuditSource(models.TextChoices):
    UI = "ui", "Dashboard"
    API = "api", "API"
    ADMIN = "admin", "Admin"
    CLI = "cli", "CLI"
    CODE = "code", "Code"  # application code, through jobs.enqueue / @task's .enqueue
    SYSTEM = "system", "System"


class AuditEvent(models.Model):
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=64)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=255, blank=True, default="")
    changes = models.JSONField(default=dict, blank=True)  # {"field": [before, after]}
    source = models.CharField(max_length=16, choices=AuditSource.choices)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["object_type", "object_id"], name="audit_object_idx"),
            # The audit log's filters offer the actors and actions that occur: read through these
            # (a loose index scan), not a scan of every event (a million jobs made a million).
            models.Index(fields=["action"], name="audit_action_idx"),
            models.Index(fields=["actor_name"], name="audit_actor_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.actor_name or 'system'} {self.action} {self.object_type}:{self.object_id}"


class ApiToken(models.Model):
    """An API key, stored as its SHA-256 digest: the key itself is shown once, when issued, and
    cannot be read back from the database, the admin or a backup. ``prefix`` (its first
    characters) tells an operator which key is which. A key past ``expires_at`` is refused."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=64, blank=True, default="")
    prefix = models.CharField(max_length=12)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)  # None: never
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user_id", "created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'token'})"

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or timezone.now())


class NotificationEvent(models.TextChoices):
    """What a run that ended badly may be told about (its final attempt: a failure that is retried
    is told about only when the last attempt fails too)."""

    FAILED = "failed", "Failed"
    TIMED_OUT = "timed_out", "Timed out"
    LOST = "lost", "Lost"
    SKIPPED = "skipped", "Skipped (misfire or overlap)"
    # A run that succeeded after the job's previous run had failed, timed out or been lost.
    RECOVERED = "recovered", "Recovered (succeeded after a failure)"
    # A run whose body started more than the rule's late_after_seconds after it was due (an SLA).
    LATE_START = "late_start", "Started late"


class NotificationChannel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (POST JSON)"
    EMAIL = "email", "E-mail"


class NotificationRule(models.Model):
    """Tell someone when a run ends badly: for one job or (no job) every job."""

    name = models.CharField(max_length=200, unique=True)
    job = models.ForeignKey(
        Job,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="notification_rules",
        help_text="Empty: every job.",
    )
    events = models.JSONField(
        default=list,
        help_text="Any of: failed, timed_out, lost, skipped, recovered, late_start.",
    )
    late_after_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="late_start: a run whose body started more than this after it was due.",
    )
    channel = models.CharField(max_length=16, choices=NotificationChannel.choices)
    target = models.CharField(
        max_length=1000,
        help_text="Webhook: an http(s) URL. E-mail: addresses, comma-separated.",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NotificationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class Notification(models.Model):
    """One rule told about one run: what was (or is to be) sent, and how it went."""

    rule = models.ForeignKey(
        NotificationRule, on_delete=models.CASCADE, related_name="notifications"
    )
    execution = models.ForeignKey(JobExecution, on_delete=models.CASCADE, related_name="+")
    event = models.CharField(max_length=16, choices=NotificationEvent.choices)
    status = models.CharField(
        max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_error = models.TextField(blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "execution", "event"], name="notification_once_per_event"
            )
        ]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="notification_due_idx")]

    def __str__(self) -> str:
        return f"{self.rule} · run #{self.execution_id} {self.event} ({self.status})"
