"""The dashboard's job editor form.

The form only turns HTML form values into the JSON-like values ``jobs.validation.clean_job`` takes
(numbers, booleans, JSON lists and objects, aware datetimes). Every rule about what a valid job is
stays in ``clean_job``, run by the services: the view maps its ``JobValidationError`` back onto the
form's fields, so the dashboard, the API, the admin and the CLI can never disagree.
"""

from __future__ import annotations

import json
import zoneinfo
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django import forms
from django.utils.dateparse import parse_datetime

from jobs import registry
from jobs.models import ConcurrencyPolicy, Isolation, Job, MisfirePolicy, ScheduleType
from jobs.validation import JOB_DEFAULTS, WRITABLE_FIELDS

ERR_BAD_JSON = "Must be valid JSON ({reason})."
ERR_BAD_DATETIME = "Enter a date and time, e.g. 2026-12-01 10:00."
# The value datetime-local inputs accept and show: seconds kept, so an unchanged run_at round-trips.
DATETIME_LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"

# Which form fields belong to which schedule type; only those of the chosen type are submitted
# (clean_job refuses a field of another type that is sent with a value).
SCHEDULE_TYPE_FIELDS = {
    ScheduleType.CRON: ("cron_expression", "timezone"),
    ScheduleType.INTERVAL: ("interval_seconds", "start_at"),
    ScheduleType.ONCE: ("run_at",),
}
ALL_SCHEDULE_FIELDS = ("cron_expression", "timezone", "interval_seconds", "start_at", "run_at")


@lru_cache(maxsize=1)
def timezone_names() -> tuple[str, ...]:
    return tuple(sorted(zoneinfo.available_timezones()))


def _viewer_zone(name: str) -> zoneinfo.ZoneInfo | type[UTC]:
    try:
        return zoneinfo.ZoneInfo(name) if name else UTC
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        return UTC


class JsonTextField(forms.CharField):
    """A textarea holding JSON; cleans to the parsed value (shape is checked by clean_job)."""

    def __init__(self, *, empty: Any, **kwargs: Any) -> None:
        self.empty = empty
        kwargs.setdefault("widget", forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}))
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, list | dict):
            return json.dumps(value, indent=2)
        return value

    def clean(self, value: Any) -> Any:
        text = super().clean(value).strip()
        if not text:
            return self.empty
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(ERR_BAD_JSON.format(reason=exc.msg)) from exc


class LocalDateTimeField(forms.CharField):
    """A ``datetime-local`` input. A value without an offset is wall-clock time in the viewer's time
    zone (the form's ``viewer_timezone``, filled in by the page's script; UTC without script)."""

    widget = forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"})

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, datetime):
            return value.astimezone(UTC).strftime(DATETIME_LOCAL_FORMAT)
        return value

    def to_python(self, value: Any) -> str:
        return super().to_python(value).strip()


class JobForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), max_length=10_000
    )
    task = forms.ChoiceField()
    args = JsonTextField(
        label="Arguments", empty=[], help_text="Positional arguments: a JSON list, e.g. [30]."
    )
    kwargs = JsonTextField(
        label="Keyword arguments",
        empty={},
        help_text='Keyword arguments: a JSON object, e.g. {"message": "hi"}.',
    )

    schedule_type = forms.ChoiceField(choices=ScheduleType.choices, widget=forms.RadioSelect)
    cron_expression = forms.CharField(
        required=False,
        max_length=200,
        help_text="5 fields (minute hour day month weekday) or 6 with seconds first; @daily etc.",
        widget=forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"}),
    )
    timezone = forms.CharField(
        label="Time zone",
        required=False,
        max_length=64,
        help_text="IANA time zone the cron fields are read in, e.g. Europe/Berlin.",
        widget=forms.TextInput(attrs={"list": "timezone-names", "autocomplete": "off"}),
    )
    interval_seconds = forms.IntegerField(required=False, help_text="Seconds between runs.")
    start_at = LocalDateTimeField(help_text="Optional anchor of the interval slots (your time).")
    run_at = LocalDateTimeField(help_text="When the job runs (your time).")
    viewer_timezone = forms.CharField(required=False, widget=forms.HiddenInput, initial="UTC")

    enabled = forms.BooleanField(required=False, help_text="A paused job does not fire.")
    misfire_policy = forms.ChoiceField(choices=MisfirePolicy.choices)
    misfire_grace_seconds = forms.IntegerField(
        help_text="How late a fire may still start before the misfire policy applies."
    )
    run_all_max = forms.IntegerField(help_text="Most missed fires 'Run all' catches up.")
    concurrency_policy = forms.ChoiceField(choices=ConcurrencyPolicy.choices)

    max_retries = forms.IntegerField()
    retry_backoff_base = forms.FloatField(help_text="Seconds before the first retry.")
    retry_backoff_factor = forms.FloatField(help_text="Each further delay is multiplied by this.")
    retry_backoff_max = forms.FloatField(help_text="Longest single delay, in seconds.")
    retry_jitter = forms.BooleanField(required=False, help_text="Randomise delays a little.")

    timeout_seconds = forms.IntegerField(required=False, help_text="Empty means no timeout.")
    isolation = forms.ChoiceField(choices=Isolation.choices)
    queue = forms.CharField(max_length=64)
    priority = forms.IntegerField(help_text="Higher runs first when nodes are busy.")
    spread_seconds = forms.IntegerField(
        help_text="Delay each fire by a stable per-job offset below this, to avoid stampedes."
    )

    def __init__(self, *args: Any, job: Job | None = None, **kwargs: Any) -> None:
        if job is not None and "initial" not in kwargs:
            kwargs["initial"] = {field: getattr(job, field) for field in WRITABLE_FIELDS}
        # A new job starts as a cron schedule: the most common kind, and the preview shows it.
        kwargs.setdefault("initial", {**JOB_DEFAULTS, "schedule_type": ScheduleType.CRON})
        super().__init__(*args, **kwargs)
        self.job = job
        names = registry.task_names()
        current = job.task if job is not None else None
        if current and current not in names:
            names = [current, *names]  # still shown, so an edit can move off a removed task
        self.fields["task"].choices = [("", "Choose a task…")] + [(n, n) for n in names]
        self.fields["timezone"].widget.attrs["placeholder"] = "UTC"
        self.fields["cron_expression"].widget.attrs["placeholder"] = "*/5 * * * *"

    def _clean_datetime(self, name: str) -> datetime | None:
        raw = self.cleaned_data.get(name) or ""
        if not raw:
            return None
        try:
            parsed = parse_datetime(raw)
        except ValueError:
            parsed = None
        if parsed is None:
            self.add_error(name, ERR_BAD_DATETIME)
            return None
        if parsed.tzinfo is None:
            zone = _viewer_zone(self.cleaned_data.get("viewer_timezone", ""))
            parsed = parsed.replace(tzinfo=zone)
        return parsed.astimezone(UTC)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        cleaned["start_at"] = self._clean_datetime("start_at")
        cleaned["run_at"] = self._clean_datetime("run_at")
        return cleaned

    def service_data(self) -> dict[str, Any]:
        """The cleaned values as ``clean_job`` input: schedule fields of other types left out."""
        data = {
            field: self.cleaned_data.get(field)
            for field in WRITABLE_FIELDS
            if field not in ALL_SCHEDULE_FIELDS
        }
        schedule_type = data["schedule_type"]
        for field in SCHEDULE_TYPE_FIELDS.get(schedule_type, ()):
            data[field] = self.cleaned_data.get(field)
        if schedule_type == ScheduleType.CRON:
            data["cron_expression"] = data["cron_expression"] or ""
            data["timezone"] = data["timezone"] or "UTC"
        run_at = data.get("run_at")
        if self.job is not None and self.job.run_at and run_at:
            # The input keeps whole seconds: an untouched run_at must compare equal to the stored
            # one, or a one-off that already fired would be refused as "in the past".
            if self.job.run_at.replace(microsecond=0) == run_at:
                data["run_at"] = self.job.run_at
        return data

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        for key, messages in errors.items():
            field = key if key in self.fields else None
            for message in messages:
                self.add_error(field, message if field else f"{key}: {message}")

    # Field groups for the template (fieldsets).
    @property
    def policy_fields(self) -> list[forms.BoundField]:
        names = ("misfire_policy", "misfire_grace_seconds", "run_all_max", "concurrency_policy")
        return [self[name] for name in names]

    @property
    def retry_fields(self) -> list[forms.BoundField]:
        names = (
            "max_retries",
            "retry_backoff_base",
            "retry_backoff_factor",
            "retry_backoff_max",
            "retry_jitter",
        )
        return [self[name] for name in names]

    @property
    def execution_fields(self) -> list[forms.BoundField]:
        names = ("timeout_seconds", "isolation", "queue", "priority", "spread_seconds")
        return [self[name] for name in names]


class JobVersionForm(forms.Form):
    """The version an editor read, carried by the edit and delete forms (optimistic locking)."""

    version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
