"""API representations. Reads use model serializers. Writes are validated by ``jobs.validation`` and
their bodies are described by JSON Schema derived from the same table (``jobs.definition``), so the
schema and the server cannot drift apart."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from jobs import flow, notifications
from jobs.definition import WRITABLE_FIELDS, job_body_schema, json_schema
from jobs.models import (
    MAX_FLOW_LIMIT,
    MAX_PRIORITY,
    MAX_RATE_PERIOD_S,
    AuditEvent,
    Job,
    JobExecution,
    NotificationChannel,
    NotificationEvent,
    NotificationRule,
)
from jobs.roles import ADMIN, has_role
from jobs.selectors import job_schedule_description
from jobs.services import MAX_BATCH_JOBS, MAX_ENQUEUE_RUNS


class JobSerializer(serializers.ModelSerializer):
    schedule_description = serializers.SerializerMethodField()
    created_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    updated_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

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


def job_create_body() -> dict[str, Any]:
    return job_body_schema()


def job_replace_body() -> dict[str, Any]:
    return job_body_schema(version=True)


def job_patch_body() -> dict[str, Any]:
    return json_schema(None, version=True)


def job_batch_body() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "jobs": {
                "type": "array",
                "items": job_body_schema(),
                "minItems": 1,
                "maxItems": MAX_BATCH_JOBS,
                "description": f"1 to {MAX_BATCH_JOBS:,} job definitions.",
            }
        },
        "required": ["jobs"],
        "additionalProperties": False,
    }


def _run_call() -> dict[str, Any]:
    """A run's own arguments (absent: the job's): in a run-now body and in each enqueued run."""
    return {
        "args": {
            "type": "array",
            "items": {},
            "nullable": True,
            "description": "Positional arguments of this run; absent: the job's.",
        },
        "kwargs": {
            "type": "object",
            "additionalProperties": True,
            "nullable": True,
            "description": "Keyword arguments of this run; absent: the job's.",
        },
    }


def trigger_body() -> dict[str, Any]:
    """Run now: optionally with arguments of this run's own (absent: the job's)."""
    return {
        "type": "object",
        "properties": _run_call(),
        "additionalProperties": False,
    }


def enqueue_body() -> dict[str, Any]:
    run = {
        "type": "object",
        "properties": {
            **_run_call(),
            "run_at": {
                "type": "string",
                "format": "date-time",
                "nullable": True,
                "description": "Not before this instant (with a zone); absent or past: now.",
            },
            "priority": {
                "type": "integer",
                "minimum": -MAX_PRIORITY,
                "maximum": MAX_PRIORITY,
                "nullable": True,
                "description": "Absent: the job's.",
            },
            "idempotency_key": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
                "nullable": True,
                "description": "Unique per job: a run sent again with a key the job already "
                "has a run for gets that run back, and no new one is made.",
            },
        },
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "runs": {
                "type": "array",
                "items": run,
                "minItems": 1,
                "maxItems": MAX_ENQUEUE_RUNS,
                "description": f"1 to {MAX_ENQUEUE_RUNS:,} runs.",
            }
        },
        "required": ["runs"],
        "additionalProperties": False,
    }


class JobBatchResultSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    jobs = JobSerializer(many=True)


class EnqueueResultSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Runs this request made.")
    ids = serializers.ListField(child=serializers.IntegerField(), help_text="In the order sent.")
    already_enqueued = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="Indexes of the runs whose idempotency_key the job already had a run for "
        "(its id is in ids; nothing new was made for them).",
    )


class ExecutionSerializer(serializers.ModelSerializer):
    job_name = serializers.CharField(source="job.name", read_only=True)
    triggered_by = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )
    lag_ms = serializers.SerializerMethodField()
    waiting = serializers.SerializerMethodField(
        help_text='What a pending run waits for, e.g. "waiting: queue reports limit 4 reached" '
        '(a flow limit) or "waiting: queue reports paused"; empty when it waits for nothing '
        "but its instant."
    )
    parent = serializers.PrimaryKeyRelatedField(
        read_only=True,
        allow_null=True,
        help_text="The run whose final outcome made this one (a chained run); else null.",
    )

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
            "waiting",
            "triggered_by",
            "parent",
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

    def get_waiting(self, execution: JobExecution) -> str:
        return flow.waiting_reason(execution)


class ExecutionDetailSerializer(ExecutionSerializer):
    """One run, with the runs its outcome made through its job's chains (read for one run only:
    a list of runs would read them once per row)."""

    chained_runs = serializers.PrimaryKeyRelatedField(
        many=True,
        read_only=True,
        help_text="The runs this run's final outcome made through its job's on_success, "
        "on_failure and on_end.",
    )

    class Meta(ExecutionSerializer.Meta):
        fields = [*ExecutionSerializer.Meta.fields, "chained_runs"]
        read_only_fields = fields


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


class DstDaySerializer(serializers.Serializer):
    change = serializers.DateTimeField(help_text="When the time zone changes its offset (UTC).")
    direction = serializers.ChoiceField(
        choices=["forward", "back"],
        help_text="forward: an hour is skipped (spring); back: an hour happens twice (autumn).",
    )
    fires = serializers.ListField(
        child=serializers.DateTimeField(),
        help_text="The job's fires that local day under its DST rules.",
    )
    more = serializers.BooleanField(help_text="More fires that day than listed.")


class SchedulePreviewSerializer(serializers.Serializer):
    next_fires = serializers.ListField(child=serializers.DateTimeField())
    description = serializers.CharField()
    dst_days = DstDaySerializer(
        many=True,
        help_text="A cron schedule's fires on the next days its time zone changes offset (none "
        "for other schedules, or a zone without DST).",
    )

    def to_representation(self, instance: Any) -> Any:
        return instance


class TaskParameterSerializer(serializers.Serializer):
    name = serializers.CharField()
    type = serializers.ChoiceField(
        choices=["string", "number", "integer", "boolean", "array", "object", "any"]
    )
    required = serializers.BooleanField()
    default = serializers.JSONField(required=False, help_text="When not required.")
    keyword_only = serializers.BooleanField(required=False)


class TaskExampleSerializer(serializers.Serializer):
    args = serializers.ListField(child=serializers.JSONField(), required=False)
    kwargs = serializers.DictField(child=serializers.JSONField(), required=False)


class TaskSerializer(serializers.Serializer):
    """A registered task (read-only)."""

    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    parameters = TaskParameterSerializer(many=True)
    example = TaskExampleSerializer()


class NotificationRuleSerializer(serializers.ModelSerializer):
    job_name = serializers.SerializerMethodField(help_text="The rule's job (null: every job).")
    target = serializers.SerializerMethodField(
        help_text="Webhook URL or e-mail addresses; a URL is redacted to scheme, host and port "
        "for anyone but an admin (it usually holds its credential)."
    )

    class Meta:
        model = NotificationRule
        fields = [
            "id",
            "name",
            "job",
            "job_name",
            "events",
            "late_after_seconds",
            "channel",
            "target",
            "enabled",
            "created_at",
        ]

    def get_job_name(self, rule: NotificationRule) -> str | None:
        return rule.job.name if rule.job_id else None

    def get_target(self, rule: NotificationRule) -> str:
        request = self.context.get("request")
        user = getattr(request, "user", None)
        if user is not None and has_role(user, ADMIN):
            return rule.target
        return notifications.redact_url(rule.target)


class QueueSerializer(serializers.Serializer):
    """A queue: its flow control, its jobs, what runs and what waits."""

    name = serializers.CharField()
    max_concurrent = serializers.IntegerField(
        allow_null=True, help_text="At most this many runs of the queue at once (null: no bound)."
    )
    rate_limit = serializers.IntegerField(
        allow_null=True, help_text="At most this many starts per rate_period_seconds (null: none)."
    )
    rate_period_seconds = serializers.IntegerField()
    paused = serializers.BooleanField(help_text="A paused queue's runs are not started.")
    jobs = serializers.IntegerField(help_text="Jobs in the queue.")
    running = serializers.IntegerField()
    pending = serializers.IntegerField()
    held = serializers.IntegerField(help_text="Pending runs a flow limit holds back.")
    configured = serializers.BooleanField(help_text="Whether anything is set on the queue.")


def queue_body() -> dict[str, Any]:
    limit = {"type": "integer", "minimum": 1, "maximum": MAX_FLOW_LIMIT, "nullable": True}
    return {
        "type": "object",
        "properties": {
            "max_concurrent": {
                **limit,
                "description": "At most this many runs of the queue at once; null: no bound.",
            },
            "rate_limit": {
                **limit,
                "description": "At most this many starts per rate_period_seconds; null: none.",
            },
            "rate_period_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_RATE_PERIOD_S},
            "paused": {"type": "boolean"},
        },
        "additionalProperties": False,
    }


def notification_rule_body() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 200},
            "job": {
                "oneOf": [{"type": "integer"}, {"type": "string"}],
                "nullable": True,
                "description": "A job's id or name; absent or null: every job.",
            },
            "events": {
                "type": "array",
                "items": {"type": "string", "enum": list(NotificationEvent.values)},
                "minItems": 1,
            },
            "late_after_seconds": {
                "type": "integer",
                "minimum": 1,
                "nullable": True,
                "description": "late_start: how late (seconds past due) a start may be.",
            },
            "channel": {"type": "string", "enum": list(NotificationChannel.values)},
            "target": {"type": "string", "minLength": 1, "maxLength": 1000},
            "enabled": {"type": "boolean"},
        },
        "required": ["name", "events", "channel", "target"],
        "additionalProperties": False,
    }
