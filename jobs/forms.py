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
from typing import Any

from django import forms
from django.forms.fields import InvalidJSONInput
from django.utils.dateparse import parse_datetime

from jobs import registry
from jobs.definition import (
    BOOLEAN,
    CHAIN_FIELDS,
    CHOICE,
    DATETIME,
    FIELDS,
    INTEGER,
    JOB_DEFAULTS,
    LIST,
    NUMBER,
    OBJECT,
    RULES,
    SCHEDULE_FIELDS,
    WRITABLE_FIELDS,
    FieldRule,
)
from jobs.models import Job, ScheduleType

ERR_BAD_JSON = "Must be valid JSON ({reason})."
ERR_JSON_TOO_DEEP = "Must be valid JSON: this is nested deeper than any job's arguments may be."
ERR_BAD_DATETIME = "Enter a date and time, e.g. 2026-12-01 10:00."
# The value datetime-local inputs accept and show: seconds kept, so an unchanged run_at round-trips.
DATETIME_LOCAL_FORMAT = "%Y-%m-%dT%H:%M:%S"


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
        except RecursionError as exc:  # the depth itself is clean_job's to refuse
            raise forms.ValidationError(ERR_JSON_TOO_DEEP) from exc


class DepthSafeJSONField(forms.JSONField):
    """Django's form JSONField, with JSON nested past Python's recursion limit a form error (it
    was a RecursionError, a 500, when parsed and again when the form was shown back)."""

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError as exc:
            raise forms.ValidationError(ERR_JSON_TOO_DEEP) from exc

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)


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


def _form_field(rule: FieldRule) -> forms.Field:
    """The dashboard's input for one field of the job definition: its label and help from the
    table; only the widget is the form's own. The values are checked by ``clean_job``."""
    common: dict[str, Any] = {"label": rule.title, "help_text": rule.help}
    # What the editor must always fill: not the schedule's fields (only one type's are shown),
    # not what may be empty or null.
    optional = (
        rule.nullable
        or rule.schedule is not None
        or rule.default == ""
        or rule.kind in (BOOLEAN, LIST, OBJECT)
    )
    common["required"] = not optional
    if rule.kind == LIST:
        return JsonTextField(empty=[], **common)
    if rule.kind == OBJECT:
        return JsonTextField(empty={}, **common)
    if rule.kind == DATETIME:
        return LocalDateTimeField(**common)
    if rule.kind == BOOLEAN:
        return forms.BooleanField(**common)
    if rule.kind == INTEGER:
        return forms.IntegerField(**common)
    if rule.kind == NUMBER:
        return forms.FloatField(**common)
    if rule.kind == CHOICE and isinstance(rule.choices, type):
        widget = forms.RadioSelect if rule.name == "schedule_type" else None
        return forms.ChoiceField(choices=rule.choice_pairs(), widget=widget, **common)
    if rule.name == "task":
        return forms.ChoiceField(**common)  # choices are read when the form is built
    widget: forms.Widget | None = None
    if rule.name == "description":
        widget = forms.Textarea(attrs={"rows": 2})
    elif rule.name == "cron_expression":
        widget = forms.TextInput(attrs={"spellcheck": "false", "autocomplete": "off"})
    elif rule.name == "timezone":  # a text input over a list of every zone name
        widget = forms.TextInput(attrs={"list": "timezone-names", "autocomplete": "off"})
    return forms.CharField(max_length=rule.max_length or 64, widget=widget, **common)


class JobForm(forms.Form):
    """The job editor: one input per field of ``jobs.definition.FIELDS``, plus the viewer's time
    zone (how a date-time typed without an offset is read)."""

    viewer_timezone = forms.CharField(required=False, widget=forms.HiddenInput, initial="UTC")

    def __init__(self, *args: Any, job: Job | None = None, **kwargs: Any) -> None:
        if job is not None and "initial" not in kwargs:
            kwargs["initial"] = {field: getattr(job, field) for field in WRITABLE_FIELDS}
        # A new job starts as a cron schedule: the most common kind, and the preview shows it.
        kwargs.setdefault("initial", {**JOB_DEFAULTS, "schedule_type": ScheduleType.CRON})
        super().__init__(*args, **kwargs)
        for rule in FIELDS:
            self.fields[rule.name] = _form_field(rule)
        self.order_fields(WRITABLE_FIELDS)
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
            if field not in SCHEDULE_FIELDS
        }
        # Only the chosen type's schedule fields are submitted (clean_job refuses a field of
        # another type that is sent with a value).
        schedule_type = data["schedule_type"]
        for field, kind in SCHEDULE_FIELDS.items():
            if kind == schedule_type:
                data[field] = self.cleaned_data.get(field)
        if schedule_type == ScheduleType.CRON:
            data["cron_expression"] = data["cron_expression"] or ""
            data["timezone"] = data["timezone"] or "UTC"
            for name in ("dst_repeated", "dst_missing"):  # not sent: cron's own rules
                data[name] = data[name] or RULES[name].default
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
    def flow_fields(self) -> list[forms.BoundField]:
        names = ("max_concurrent", "rate_limit", "rate_period_seconds")
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
    def chain_fields(self) -> list[forms.BoundField]:
        return [self[name] for name in CHAIN_FIELDS]

    @property
    def execution_fields(self) -> list[forms.BoundField]:
        names = ("timeout_seconds", "isolation", "queue", "priority", "spread_seconds")
        return [self[name] for name in names]


class JobVersionForm(forms.Form):
    """The version an editor read, carried by the edit and delete forms (optimistic locking)."""

    version = forms.IntegerField(min_value=1, widget=forms.HiddenInput)
