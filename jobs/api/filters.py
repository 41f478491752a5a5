"""Query filters that refuse what their schema does not allow (400 naming the parameter).

django-filter is lenient by default: an empty value, or a boolean it cannot read, means "no filter",
so a typo silently returns everything. Here a typed filter (boolean, number, date-time, choice)
given an empty or unreadable value is a 400; only free-text filters take an empty string.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import django_filters
from django import forms
from django.db import models
from django.utils.dateparse import parse_datetime
from django_filters.fields import IsoDateTimeField
from django_filters.rest_framework import DjangoFilterBackend
from django_filters.rest_framework import FilterSet as RestFilterSet
from drf_spectacular.utils import extend_schema_field
from rest_framework import filters
from rest_framework.exceptions import ValidationError

from jobs import selectors
from jobs.models import AuditEvent, Job, JobExecution
from jobs.states import ExecutionStatus
from jobs.validation import DATETIME_MAX, DATETIME_MIN, ERR_NOT_DATETIME, in_datetime_range

ERR_EMPTY = "Must not be empty."
ERR_BOOLEAN = "Must be true or false."
# Ids and counters are stored as 32-bit or wider integers; a filter beyond that matches nothing.
MAX_FILTER_INT = 2**31 - 1


class _BooleanField(forms.Field):
    def to_python(self, value: Any) -> bool | None:
        if value in (None, ""):
            return None
        if value in ("true", "false"):
            return value == "true"
        raise forms.ValidationError(ERR_BOOLEAN, code="boolean")


class BooleanFilter(django_filters.BooleanFilter):
    """``true`` or ``false`` (what the schema says a boolean is in a query string)."""

    field_class = _BooleanField


class _IntegerField(forms.IntegerField):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", 0)
        kwargs.setdefault("max_value", MAX_FILTER_INT)
        super().__init__(*args, **kwargs)


@extend_schema_field({"type": "integer", "minimum": 0, "maximum": MAX_FILTER_INT})
class IntegerFilter(django_filters.NumberFilter):
    """A whole number in the range of the database's ids and counters."""

    field_class = _IntegerField


def clamped(value: datetime) -> datetime:
    """A filter bound moved into the range the database stores (``DATETIME_MIN`` to
    ``DATETIME_MAX``): nothing stored lies outside it, so a bound before it selects from the
    start and one after it up to the end (it was a 500: the conversion to UTC overflowed)."""
    if in_datetime_range(value):
        return value
    return DATETIME_MIN if value.year < 5000 else DATETIME_MAX


class _BoundedIsoDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time with an offset, as the schema says (a bare date or a naive time is a
    400), any year: bounds outside what the database stores are clamped."""

    def to_python(self, value: Any) -> datetime | None:
        if value in self.empty_values:
            return None
        try:
            parsed = parse_datetime(str(value).strip())
        except ValueError:
            parsed = None
        if parsed is None or parsed.tzinfo is None:
            raise forms.ValidationError(ERR_NOT_DATETIME, code="invalid")
        return parsed

    def clean(self, value: Any) -> Any:
        cleaned = super().clean(value)
        return clamped(cleaned) if cleaned is not None else None


class DateTimeBound(django_filters.IsoDateTimeFilter):
    field_class = _BoundedIsoDateTimeField


class StrictFilterSet(RestFilterSet):
    FILTER_DEFAULTS = {
        **RestFilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": BooleanFilter},
        models.PositiveIntegerField: {"filter_class": IntegerFilter},
        models.IntegerField: {"filter_class": IntegerFilter},
    }

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name, flt in self.filters.items():
            if isinstance(flt, django_filters.CharFilter) or name not in self.data:
                continue
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else [self.data[name]]
            if any(not str(value).strip() for value in values):
                self.form.add_error(name, ERR_EMPTY)
                valid = False
        return valid


class StrictFilterBackend(DjangoFilterBackend):
    """The filter backend, building its automatic filter sets (``filterset_fields``) strict."""

    filterset_base = StrictFilterSet


class JobFilter(StrictFilterSet):
    tag = django_filters.CharFilter(method="filter_tag", help_text="Jobs carrying this tag.")

    def filter_tag(self, queryset: models.QuerySet, name: str, value: str) -> models.QuerySet:
        return queryset.filter(selectors.tagged(value)) if value else queryset

    class Meta:
        model = Job
        fields = ["enabled", "task", "schedule_type", "queue", "concurrency_policy"]


class ExecutionFilter(StrictFilterSet):
    job = IntegerFilter(field_name="job_id")
    # No DISTINCT (the filter's default): a status filter joins nothing that could repeat a run,
    # and DISTINCT made the page and its count read every run of that status.
    status = django_filters.MultipleChoiceFilter(choices=ExecutionStatus.choices, distinct=False)
    job_name = django_filters.CharFilter(field_name="job__name")
    scheduled_after = DateTimeBound(field_name="scheduled_for", lookup_expr="gte")
    scheduled_before = DateTimeBound(field_name="scheduled_for", lookup_expr="lt")
    created_after = DateTimeBound(field_name="created_at", lookup_expr="gte")
    created_before = DateTimeBound(field_name="created_at", lookup_expr="lt")
    finished_after = DateTimeBound(field_name="finished_at", lookup_expr="gte")
    finished_before = DateTimeBound(field_name="finished_at", lookup_expr="lt")
    updated_after = DateTimeBound(field_name="updated_at", lookup_expr="gt")

    class Meta:
        model = JobExecution
        fields = ["job", "status", "node", "trigger", "queue", "attempt"]


class AuditEventFilter(StrictFilterSet):
    since = DateTimeBound(field_name="created_at", lookup_expr="gte")
    until = DateTimeBound(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEvent
        fields = ["object_type", "object_id", "action", "actor_name", "source"]


class SearchFilter(filters.SearchFilter):
    """DRF's search, its refusal (a NUL in the text) keyed by the parameter like every other."""

    def get_search_terms(self, request: Any) -> list[str]:
        try:
            return super().get_search_terms(request)
        except ValidationError as exc:
            raise ValidationError({self.search_param: exc.detail}) from exc


ERR_ORDERING = "Unknown field {terms}: order by {fields}, each optionally prefixed by '-'."


class OrderingFilter(filters.OrderingFilter):
    """DRF's ordering, refusing a field it cannot order by (400 naming them) rather than ignoring
    it; its schema lists the fields as a pattern."""

    def _fields(self, queryset: Any, view: Any, request: Any = None) -> list[str]:
        context = {"request": request}
        return [name for name, _label in self.get_valid_fields(queryset, view, context)]

    def get_ordering(self, request: Any, queryset: Any, view: Any) -> Any:
        raw = request.query_params.get(self.ordering_param)
        if raw is None:
            return self.get_default_ordering(view)
        fields = self._fields(queryset, view, request)
        terms = raw.split(",")
        bad = [term for term in terms if term.removeprefix("-") not in fields]
        if bad:
            message = ERR_ORDERING.format(terms=", ".join(map(repr, bad)), fields=", ".join(fields))
            raise ValidationError({self.ordering_param: [message]})
        return terms

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        fields = "|".join(re.escape(name) for name in self._fields(view.get_queryset(), view))
        for parameter in parameters:
            parameter["schema"]["pattern"] = f"^-?({fields})(,-?({fields}))*$"
        return parameters
