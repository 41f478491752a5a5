"""REST API views: thin — parse, call one service or selector, render."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import notification_rules, queues, registry, schedules, services
from jobs.api.filters import AuditEventFilter, ExecutionFilter, JobFilter
from jobs.api.serializers import (
    AuditEventSerializer,
    EnqueueResultSerializer,
    ExecutionDetailSerializer,
    ExecutionSerializer,
    JobBatchResultSerializer,
    JobSerializer,
    NotificationRuleSerializer,
    QueueSerializer,
    SchedulePreviewSerializer,
    TaskSerializer,
    enqueue_body,
    job_batch_body,
    job_create_body,
    job_patch_body,
    job_replace_body,
    notification_rule_body,
    queue_body,
    trigger_body,
)
from jobs.definition import RULES, SCHEDULE_FIELDS, field_schema
from jobs.models import AuditEvent, AuditSource, Job, JobExecution, NotificationRule
from jobs.roles import OPERATOR
from jobs.validation import ERR_UNKNOWN_FIELD, MAX_PREVIEW_COUNT, schedule_preview_args

ERR_BODY_NOT_OBJECT = "Expected a JSON object."
ERR_BAD_VERSION = "Must be an integer."
PREVIEW_DEFAULT_COUNT = 5
MAX_VERSION_DIGITS = 18


def actor_from(request: Request) -> services.Actor:
    return services.Actor(
        user=request.user, source=AuditSource.API, remote_addr=request.META.get("REMOTE_ADDR")
    )


def _required_body(request: Request) -> dict[str, Any]:
    """``_body``, refusing a request that sent none at all (``{}`` is a body)."""
    try:
        sent = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        sent = 0
    if sent == 0:
        raise ValidationError({"non_field_errors": [ERR_BODY_NOT_OBJECT]})
    return _body(request)


def _body(request: Request, *, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The JSON object sent; with ``only``, any other key is refused (400 naming it)."""
    if not isinstance(request.data, dict):
        raise ValidationError({"non_field_errors": [ERR_BODY_NOT_OBJECT]})
    if only is not None:
        unknown = {key: [ERR_UNKNOWN_FIELD] for key in request.data if key not in only}
        if unknown:
            raise ValidationError(unknown)
    return dict(request.data)


def _pop_version(request: Request, body: dict[str, Any]) -> int | None:
    """The version the client read: ``version`` in the body, or an If-Match header."""
    raw = body.pop("version", None)
    if raw is None:
        raw = request.headers.get("If-Match", "").strip('"W/ ') or None
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    # A version is a row counter: a string of more digits than any counter has is refused before
    # int() (which raises past 4,300 digits).
    if isinstance(raw, str) and raw.strip().isdigit() and len(raw.strip()) <= MAX_VERSION_DIGITS:
        return int(raw.strip())
    raise ValidationError({"version": [ERR_BAD_VERSION]})


ERR_BATCH_NOT_LIST = "Expected a list of job objects."


class JobViewSet(viewsets.ModelViewSet):
    """Jobs: CRUD (admin) plus trigger / pause / resume (operator)."""

    queryset = Job.objects.all()
    serializer_class = JobSerializer
    filterset_class = JobFilter
    search_fields = ["name", "description", "task"]
    ordering_fields = ["name", "next_fire_at", "created_at", "updated_at", "priority"]
    role_by_action = {
        "trigger": OPERATOR,
        "enqueue": OPERATOR,
        "pause": OPERATOR,
        "resume": OPERATOR,
    }

    @extend_schema(request=job_create_body, responses={201: JobSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = _body(request)
        job = services.job_create(data=body, by=actor_from(request))
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=job_batch_body,
        responses={201: JobBatchResultSerializer},
        description=(
            "Create up to 1,000 jobs in one request, all or none: a bad item refuses the whole "
            "batch (400, errors keyed `<index>.<field>`) and nothing is written."
        ),
    )
    @action(detail=False, methods=["post"], url_path="batch")
    def batch(self, request: Request) -> Response:
        body = _body(request, only=("jobs",))
        items = body.get("jobs")
        if not isinstance(items, list):
            raise ValidationError({"jobs": [ERR_BATCH_NOT_LIST]})
        jobs = services.jobs_create_batch(items=items, by=actor_from(request))
        return Response(
            {"count": len(jobs), "jobs": JobSerializer(jobs, many=True).data},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(request=job_replace_body, responses={200: JobSerializer})
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = _body(request)
        job = self.get_object()
        version = _pop_version(request, body)
        job = services.job_update(
            job_id=job.pk,
            expected_version=version,
            changes=body,
            by=actor_from(request),
            replace=not kwargs.get("partial", False),
        )
        return Response(JobSerializer(job).data)

    @extend_schema(request=job_patch_body, responses={200: JobSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    @extend_schema(
        parameters=[OpenApiParameter("version", int, description="Optional optimistic-lock check")]
    )
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        job = self.get_object()
        raw = request.query_params.get("version")
        try:
            version = int(raw) if raw is not None else None
        except ValueError as exc:
            raise ValidationError({"version": [ERR_BAD_VERSION]}) from exc
        services.job_delete(job_id=job.pk, by=actor_from(request), expected_version=version)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        # A schema by media type, not a function (which this project's schema class marks
        # required): the body is optional; without one the run takes the job's own arguments.
        request={"application/json": trigger_body()},
        responses={201: ExecutionSerializer},
        description=(
            "Run the job now, outside its schedule (a paused job too). The body may give this "
            "run's own `args` and `kwargs` (absent: the job's), checked against the task as an "
            "enqueued run's are: a bad call is a 400 naming the field, and nothing is written."
        ),
    )
    @action(detail=True, methods=["post"])
    def trigger(self, request: Request, pk: str | None = None) -> Response:
        # No body (or an empty object): the job's own arguments. Anything else must be an object.
        empty = isinstance(request.data, dict) and not request.data
        body = {} if empty else _body(request, only=("args", "kwargs"))
        execution = services.job_trigger(
            job_id=self.get_object().pk,
            by=actor_from(request),
            args=body.get("args"),
            kwargs=body.get("kwargs"),
        )
        return Response(ExecutionSerializer(execution).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=enqueue_body,
        responses={201: EnqueueResultSerializer, 200: EnqueueResultSerializer},
        description=(
            "Enqueue up to 5,000 runs of this job, each with arguments of its own (absent: the "
            "job's), all or none: a bad run refuses the request (400, errors keyed "
            "`<index>.<field>`) and nothing is written. Runs are due at `run_at` (absent or past: "
            "now) and follow the job's queue, timeout, retries and concurrency policy. A run with an "
            "`idempotency_key` the job already has a run for is not made again: its id is "
            "returned and its index listed in `already_enqueued` (200 when the request made "
            "nothing)."
        ),
    )
    @action(detail=True, methods=["post"])
    def enqueue(self, request: Request, pk: str | None = None) -> Response:
        body = _body(request, only=("runs",))
        runs = services.runs_enqueue(
            job_id=self.get_object().pk, items=body.get("runs"), by=actor_from(request)
        )
        made = sum(run.newly_enqueued for run in runs)
        return Response(
            {
                "count": made,
                "ids": [run.pk for run in runs],
                "already_enqueued": [i for i, run in enumerate(runs) if not run.newly_enqueued],
            },
            status=status.HTTP_201_CREATED if made else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str | None = None) -> Response:
        job = services.job_pause(job_id=self.get_object().pk, by=actor_from(request))
        return Response(JobSerializer(job).data)

    @extend_schema(request=None, responses={200: JobSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str | None = None) -> Response:
        job = services.job_resume(job_id=self.get_object().pk, by=actor_from(request))
        return Response(JobSerializer(job).data)


class ExecutionViewSet(viewsets.ReadOnlyModelViewSet):
    """Executions: list/filter and detail (viewer), cancel and retry (operator)."""

    # Prefetched, not joined: a page of the newest runs reads only those (see execution_list).
    queryset = JobExecution.objects.prefetch_related("job", "triggered_by")
    serializer_class = ExecutionSerializer
    filterset_class = ExecutionFilter
    ordering_fields = ["scheduled_for", "created_at", "started_at", "finished_at", "duration_ms"]
    role_by_action = {"cancel": OPERATOR, "retry": OPERATOR}

    def get_serializer_class(self) -> type[ExecutionSerializer]:
        return ExecutionDetailSerializer if self.action == "retrieve" else ExecutionSerializer

    @extend_schema(responses={200: ExecutionDetailSerializer})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=None, responses={200: ExecutionSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        execution = services.execution_cancel(
            execution_id=self.get_object().pk, by=actor_from(request)
        )
        return Response(ExecutionSerializer(execution).data)

    @extend_schema(request=None, responses={201: ExecutionSerializer})
    @action(detail=True, methods=["post"])
    def retry(self, request: Request, pk: str | None = None) -> Response:
        execution = services.execution_retry(
            execution_id=self.get_object().pk, by=actor_from(request)
        )
        return Response(ExecutionSerializer(execution).data, status=status.HTTP_201_CREATED)


class AuditEventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit trail (read-only)."""

    queryset = AuditEvent.objects.all()
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    search_fields = ["object_repr", "actor_name", "action"]


class NotificationRuleViewSet(viewsets.ModelViewSet):
    """Notification rules: read (viewer; a webhook URL redacted for anyone but an admin) and
    written (admin), each write audited."""

    queryset = NotificationRule.objects.select_related("job").all()
    serializer_class = NotificationRuleSerializer
    search_fields = ["name"]
    ordering_fields = ["name", "created_at"]

    @extend_schema(request=notification_rule_body, responses={201: NotificationRuleSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        rule = notification_rules.rule_save(data=_body(request), by=actor_from(request))
        return Response(self.get_serializer(rule).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=notification_rule_body, responses={200: NotificationRuleSerializer})
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        rule = self.get_object()
        data = _body(request)
        if kwargs.get("partial"):
            data = {**notification_rules.rule_data(rule), "job": rule.job_id, **data}
        rule = notification_rules.rule_save(data=data, by=actor_from(request), rule_id=rule.pk)
        return Response(self.get_serializer(rule).data)

    @extend_schema(request=notification_rule_body, responses={200: NotificationRuleSerializer})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        notification_rules.rule_delete(rule_id=self.get_object().pk, by=actor_from(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class QueueViewSet(viewsets.ViewSet):
    """Queues: every queue a job names or something is set on, with its flow control (max
    concurrent runs, a rate limit, paused) and what runs and waits there. Read (viewer), set
    (admin), paused and resumed (operator); each change audited."""

    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9][a-z0-9_.\-]{0,63}"
    role_by_action = {"pause": OPERATOR, "resume": OPERATOR}
    serializer_class = QueueSerializer

    @extend_schema(responses={200: QueueSerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response(
            QueueSerializer([v.as_dict() for v in queues.queues_overview()], many=True).data
        )

    @extend_schema(responses={200: QueueSerializer})
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        return Response(QueueSerializer(self._view(name)).data)

    @extend_schema(request=queue_body, responses={200: QueueSerializer})
    def update(self, request: Request, name: str | None = None) -> Response:
        """Set the queue whole: what the body leaves out goes back to its default."""
        queues.queue_set(
            name=str(name), data=_required_body(request), by=actor_from(request), partial=False
        )
        return Response(QueueSerializer(self._view(name)).data)

    @extend_schema(request=queue_body, responses={200: QueueSerializer})
    def partial_update(self, request: Request, name: str | None = None) -> Response:
        """Set what the body names; the rest is left as it is."""
        queues.queue_set(name=str(name), data=_required_body(request), by=actor_from(request))
        return Response(QueueSerializer(self._view(name)).data)

    @extend_schema(request=None, responses={200: QueueSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, name: str | None = None) -> Response:
        queues.queue_pause(name=str(name), by=actor_from(request))
        return Response(QueueSerializer(self._view(name)).data)

    @extend_schema(request=None, responses={200: QueueSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, name: str | None = None) -> Response:
        queues.queue_resume(name=str(name), by=actor_from(request))
        return Response(QueueSerializer(self._view(name)).data)

    @staticmethod
    def _view(name: str | None) -> dict[str, Any]:
        try:
            return queues.queue_view(str(name)).as_dict()
        except LookupError as exc:
            raise NotFound(str(exc)) from exc


class TaskCatalogView(APIView):
    """The registered tasks: what each does, its arguments (type, default) and an example call."""

    @extend_schema(responses={200: TaskSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(registry.task_catalog())


def _definition_parameter(name: str, *, required: bool = False) -> OpenApiParameter:
    """A query parameter that is a field of the job definition: its schema from the table."""
    schema = field_schema(RULES[name])
    description = schema.pop("description")
    return OpenApiParameter(name, schema, required=required, description=description)


class SchedulePreviewView(APIView):
    """The next fire times and a description of a schedule, for the editor's live preview."""

    @extend_schema(
        parameters=[
            _definition_parameter("schedule_type", required=True),
            *(_definition_parameter(name) for name in SCHEDULE_FIELDS),
            OpenApiParameter(
                "count",
                {"type": "integer", "minimum": 1, "maximum": MAX_PREVIEW_COUNT, "default": 5},
                description="How many fire times.",
            ),
        ],
        responses={200: SchedulePreviewSerializer},
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        kwargs, count = schedule_preview_args(params, default_count=PREVIEW_DEFAULT_COUNT)
        now = timezone.now()
        try:
            fires = schedules.next_fires(count=count, after=now, **kwargs)
            description = schedules.describe_schedule(
                **{k: v for k, v in kwargs.items() if k != "start_at"}
            )
            days = (
                schedules.dst_days(
                    after=now,
                    cron_expression=kwargs["cron_expression"],
                    timezone=kwargs["timezone"],
                    dst_repeated=kwargs["dst_repeated"],
                    dst_missing=kwargs["dst_missing"],
                )
                if kwargs["schedule_type"] == schedules.SCHEDULE_CRON
                else []
            )
        except schedules.ScheduleError as exc:
            raise ValidationError({exc.field: [exc.message]}) from exc
        return Response(
            {
                "next_fires": [f.isoformat() for f in fires],
                "description": description,
                "dst_days": [
                    {
                        "change": day.change.isoformat(),
                        "direction": day.direction,
                        "fires": [f.isoformat() for f in day.fires],
                        "more": day.more,
                    }
                    for day in days
                ],
            }
        )
