"""API representations. Reads use model serializers; writes are validated by jobs.validation (the one
set of rules shared with the admin and the CLI), so ``JobWriteSerializer`` only documents the body."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from jobs.models import (
    MAX_BACKOFF_S,
    MAX_GRACE_S,
    MAX_INTERVAL_S,
    MAX_RETRIES,
    MAX_SPREAD_S,
    MAX_TIMEOUT_S,
    AuditEvent,
    ConcurrencyPolicy,
    Isolation,
    Job,
    JobExecution,
    MisfirePolicy,
    ScheduleType,
)
from jobs.selectors import job_schedule_description
from jobs.validation import WRITABLE_FIELDS


class JobSerializer(serializers.ModelSerializer):
    schedule_description = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    updated_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Job
        fields = [
            "id",
            *WRITABLE_FIELDS,
            "schedule_description",
            "next_fire_at",
            "last_fire_at",
            "version",
            "created_at",
            "updated_at",
            "created_by",
            "updated_by",
        ]
        read_only_fields = fields

    def get_schedule_description(self, job: Job) -> str:
        return job_schedule_description(job)


class JobWriteSerializer(serializers.Serializer):
    """The body of create (POST) and update (PUT/PATCH). ``version`` is required on updates."""

    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True)
    task = serializers.CharField(help_text="A registered task name, e.g. noop, sleep, log.")
    args = serializers.ListField(required=False, help_text="Positional arguments (JSON list).")
    kwargs = serializers.DictField(required=False, help_text="Keyword arguments (JSON object).")
    schedule_type = serializers.ChoiceField(choices=ScheduleType.choices)
    cron_expression = serializers.CharField(
        required=False, help_text="5 fields, or 6 with seconds first."
    )
    timezone = serializers.CharField(required=False, help_text="IANA name, e.g. Europe/Berlin.")
    interval_seconds = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_INTERVAL_S
    )
    start_at = serializers.DateTimeField(required=False, allow_null=True)
    run_at = serializers.DateTimeField(required=False)
    enabled = serializers.BooleanField(required=False)
    misfire_policy = serializers.ChoiceField(choices=MisfirePolicy.choices, required=False)
    misfire_grace_seconds = serializers.IntegerField(
        required=False, min_value=0, max_value=MAX_GRACE_S
    )
    run_all_max = serializers.IntegerField(required=False, min_value=1)
    concurrency_policy = serializers.ChoiceField(choices=ConcurrencyPolicy.choices, required=False)
    max_retries = serializers.IntegerField(required=False, min_value=0, max_value=MAX_RETRIES)
    retry_backoff_base = serializers.FloatField(
        required=False, min_value=0, max_value=MAX_BACKOFF_S
    )
    retry_backoff_factor = serializers.FloatField(required=False, min_value=1)
    retry_backoff_max = serializers.FloatField(required=False, min_value=0, max_value=MAX_BACKOFF_S)
    retry_jitter = serializers.BooleanField(required=False)
    timeout_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_TIMEOUT_S
    )
    isolation = serializers.ChoiceField(choices=Isolation.choices, required=False)
    priority = serializers.IntegerField(required=False)
    queue = serializers.CharField(required=False)
    spread_seconds = serializers.IntegerField(required=False, min_value=0, max_value=MAX_SPREAD_S)
    version = serializers.IntegerField(required=False, help_text="Required on PUT/PATCH.")


class JobBatchSerializer(serializers.Serializer):
    """The body of a batch create (schema only: the service validates every item)."""

    jobs = JobWriteSerializer(many=True, help_text="Up to 1,000 job definitions.")


class JobBatchResultSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    jobs = JobSerializer(many=True)


class EnqueuedRunSerializer(serializers.Serializer):
    """One run to enqueue (schema only: the service checks each against the job's task)."""

    args = serializers.ListField(
        required=False, help_text="Positional arguments of this run; absent: the job's."
    )
    kwargs = serializers.DictField(
        required=False, help_text="Keyword arguments of this run; absent: the job's."
    )
    run_at = serializers.DateTimeField(
        required=False, help_text="Not before this instant (with a zone); absent or past: now."
    )
    priority = serializers.IntegerField(
        required=False, min_value=-1000, max_value=1000, help_text="Absent: the job's."
    )


class EnqueueSerializer(serializers.Serializer):
    runs = EnqueuedRunSerializer(many=True, help_text="Up to 5,000 runs.")


class EnqueueResultSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    ids = serializers.ListField(child=serializers.IntegerField(), help_text="In the order sent.")


class ExecutionSerializer(serializers.ModelSerializer):
    job_name = serializers.CharField(source="job.name", read_only=True)
    triggered_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    lag_ms = serializers.SerializerMethodField()

    class Meta:
        model = JobExecution
        fields = [
            "id",
            "job",
            "job_name",
            "scheduled_for",
            "attempt",
            "trigger",
            "status",
            "run_after",
            "queue",
            "priority",
            "term",
            "node",
            "claim_token",
            "cancel_requested",
            "reason",
            "triggered_by",
            "created_at",
            "updated_at",
            "claimed_at",
            "started_at",
            "finished_at",
            "duration_ms",
            "lag_ms",
            "args",
            "kwargs",
            "result",
            "error",
            "traceback",
            "output",
        ]
        read_only_fields = fields

    def get_lag_ms(self, execution: JobExecution) -> float | None:
        """Due-to-start lag: started_at - run_after."""
        if execution.started_at is None:
            return None
        return round((execution.started_at - execution.run_after).total_seconds() * 1000, 3)


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id",
            "created_at",
            "actor_name",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "changes",
            "source",
            "remote_addr",
        ]
        read_only_fields = fields


class SchedulePreviewSerializer(serializers.Serializer):
    next_fires = serializers.ListField(child=serializers.DateTimeField())
    description = serializers.CharField()

    def to_representation(self, instance: Any) -> Any:
        return instance
