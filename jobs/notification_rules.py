"""Notification rules as data: checked, written with their audit, exported and applied by name.

The API (``/api/notification-rules/``) and ``jobs export`` / ``jobs apply`` go through here; a rule
names its job by name in a file (ids differ between installations) and by id or name in the API.
A webhook target usually holds its credential: the audit log records it redacted
(``notifications.redact_url``), and only admins read it whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from jobs import notifications
from jobs.models import Job, NotificationChannel, NotificationRule
from jobs.services import Actor, audit_record
from jobs.validation import JobValidationError

FIELDS = ("name", "job", "events", "late_after_seconds", "channel", "target", "enabled")
MAX_NAME = 200
MAX_TARGET = 1000
ERR_REQUIRED = "This field is required."
ERR_TEXT = "A string of 1 to {limit} characters."
ERR_NAME_TAKEN = "A rule with this name exists."
ERR_NO_JOB = "No job {value!r}."
ERR_CHANNEL = "One of: {choices}."
ERR_BOOLEAN = "true or false."
ERR_SECONDS = "A whole number of seconds from 1, or null."
ERR_UNKNOWN = "Unknown field."


def _text(errors: dict[str, list[str]], name: str, value: Any, limit: int) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        errors[name] = [ERR_TEXT.format(limit=limit)]
        return ""
    return value.strip()


def _job(errors: dict[str, list[str]], value: Any) -> Job | None:
    if value is None or value == "":
        return None
    found = None
    if isinstance(value, int) and not isinstance(value, bool):
        found = Job.objects.filter(pk=value).first()
    elif isinstance(value, str):
        found = Job.objects.filter(name=value).first()
    if found is None:
        errors["job"] = [ERR_NO_JOB.format(value=value)]
    return found


def clean_rule(data: Any, *, rule_id: int | None = None) -> dict[str, Any]:
    """A whole rule from ``data`` (name, events, channel and target required; job, enabled and
    late_after_seconds optional). Raises JobValidationError keyed by field."""
    if not isinstance(data, dict):
        raise JobValidationError({"non_field_errors": ["Expected an object."]})
    errors: dict[str, list[str]] = {key: [ERR_UNKNOWN] for key in data if key not in FIELDS}
    for required in ("name", "events", "channel", "target"):
        if data.get(required) in (None, ""):
            errors[required] = [ERR_REQUIRED]
    name = _text(errors, "name", data.get("name"), MAX_NAME) if "name" not in errors else ""
    if name and NotificationRule.objects.filter(name=name).exclude(pk=rule_id).exists():
        errors["name"] = [ERR_NAME_TAKEN]
    channel = data.get("channel")
    if "channel" not in errors and channel not in NotificationChannel.values:
        errors["channel"] = [ERR_CHANNEL.format(choices=", ".join(NotificationChannel.values))]
    target = (
        _text(errors, "target", data.get("target"), MAX_TARGET) if "target" not in errors else ""
    )
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        errors["enabled"] = [ERR_BOOLEAN]
    late = data.get("late_after_seconds")
    if late is not None and (isinstance(late, bool) or not isinstance(late, int) or late < 1):
        errors["late_after_seconds"] = [ERR_SECONDS]
    job = _job(errors, data.get("job"))
    if not errors:
        errors.update(
            notifications.check_rule(
                events=data.get("events"),
                channel=str(channel),
                target=target,
                late_after_seconds=late,
            )
        )
    if errors:
        raise JobValidationError(errors)
    return {
        "name": name,
        "job": job,
        "events": list(dict.fromkeys(data["events"])),
        "late_after_seconds": late,
        "channel": channel,
        "target": target,
        "enabled": enabled,
    }


def _shown(name: str, value: Any) -> Any:
    """A value as the audit log records it: a webhook URL without its credential, a job by name."""
    if name == "target":
        return notifications.redact_url(str(value))
    if name == "job":
        return value.name if value is not None else None
    return value


def _audit(*, by: Actor, action: str, rule: NotificationRule, changes: dict[str, Any]) -> None:
    audit_record(
        by=by,
        action=action,
        object_type="notification_rule",
        object_id=rule.pk,
        object_repr=rule.name,
        changes=changes,
    )


def rule_save(*, data: Any, by: Actor, rule_id: int | None = None) -> NotificationRule:
    """Create a rule, or replace rule ``rule_id`` whole, from ``data``; audited."""
    values = clean_rule(data, rule_id=rule_id)
    with transaction.atomic():
        if rule_id is None:
            rule = NotificationRule.objects.create(**values)
            changes = {k: [None, _shown(k, v)] for k, v in values.items()}
            _audit(by=by, action="notification_rule.create", rule=rule, changes=changes)
            return rule
        rule = NotificationRule.objects.select_for_update().get(pk=rule_id)
        before = {name: getattr(rule, name) for name in values}
        changes = {
            k: [_shown(k, before[k]), _shown(k, v)] for k, v in values.items() if before[k] != v
        }
        for name, value in values.items():
            setattr(rule, name, value)
        rule.save()
        if changes:
            _audit(by=by, action="notification_rule.update", rule=rule, changes=changes)
        return rule


def rule_delete(*, rule_id: int, by: Actor) -> None:
    with transaction.atomic():
        rule = NotificationRule.objects.get(pk=rule_id)
        _audit(by=by, action="notification_rule.delete", rule=rule, changes={})
        rule.delete()


def rule_data(rule: NotificationRule) -> dict[str, Any]:
    """A rule as ``clean_rule`` reads it (its job by name, its target whole)."""
    return {
        "name": rule.name,
        "job": rule.job.name if rule.job else None,
        "events": rule.events,
        "late_after_seconds": rule.late_after_seconds,
        "channel": rule.channel,
        "target": rule.target,
        "enabled": rule.enabled,
    }


def rules_export() -> list[dict[str, Any]]:
    """Every rule as ``jobs apply`` reads it back."""
    return [rule_data(r) for r in NotificationRule.objects.select_related("job").order_by("name")]


@dataclass
class RuleResult:
    name: str
    action: str  # created | updated | unchanged
    changes: dict[str, Any] = field(default_factory=dict)


def rules_apply(definitions: Any, *, by: Actor, dry_run: bool = False) -> list[RuleResult]:
    """Create or update rules by name so they match ``definitions``; every one is checked
    first (errors keyed ``"<name or #index>.<field>"``), then all are written in one
    transaction (none with ``dry_run``). Rules absent from the file are left as they are."""
    if not isinstance(definitions, list):
        raise JobValidationError({"notification_rules": ["Expected a list of rules."]})
    errors: dict[str, list[str]] = {}
    planned: list[tuple[NotificationRule | None, dict[str, Any]]] = []
    for index, item in enumerate(definitions):
        label = item.get("name") if isinstance(item, dict) and item.get("name") else f"#{index}"
        existing = NotificationRule.objects.filter(name=label).first()
        try:
            values = clean_rule(item, rule_id=existing.pk if existing else None)
        except JobValidationError as exc:
            errors.update((f"{label}.{k}", v) for k, v in exc.errors.items())
            continue
        planned.append((existing, values))
    if errors:
        raise JobValidationError(errors)
    results = []
    with transaction.atomic():
        for existing, values in planned:
            if existing is None:
                results.append(RuleResult(values["name"], "created"))
                if not dry_run:
                    rule_save(data=_as_data(values), by=by)
                continue
            changes = {
                k: [_shown(k, getattr(existing, k)), _shown(k, v)]
                for k, v in values.items()
                if getattr(existing, k) != v
            }
            results.append(
                RuleResult(values["name"], "updated" if changes else "unchanged", changes)
            )
            if changes and not dry_run:
                rule_save(data=_as_data(values), by=by, rule_id=existing.pk)
    return results


def _as_data(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "job": values["job"].pk if values["job"] is not None else None}
