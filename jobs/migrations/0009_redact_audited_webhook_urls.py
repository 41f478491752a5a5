"""The audit log no longer holds webhook URLs whole (their path, query or user:password is the
webhook's credential, and every viewer reads the log): rows written before keep the URL's scheme and
host only, as new ones do (jobs.notifications.redact_url, copied here as it is today)."""

from urllib.parse import urlsplit

from django.db import migrations


def redact_url(target):
    try:
        parts = urlsplit(target.strip())
        port = parts.port
    except ValueError:
        return "…"
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return target
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown = f"{parts.scheme}://{'…@' if '@' in parts.netloc else ''}{host}"
    if port is not None:
        shown += f":{port}"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return f"{shown}/…"
    return shown + parts.path


def redact_audited_webhook_urls(apps, schema_editor):
    AuditEvent = apps.get_model("jobs", "AuditEvent")
    for event in AuditEvent.objects.filter(object_type="notification_rule").iterator():
        pair = (event.changes or {}).get("target")
        if not isinstance(pair, list):
            continue
        redacted = [redact_url(v) if isinstance(v, str) else v for v in pair]
        if redacted != pair:
            event.changes = {**event.changes, "target": redacted}
            event.save(update_fields=["changes"])


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_slot_index"),
    ]

    operations = [
        migrations.RunPython(redact_audited_webhook_urls, migrations.RunPython.noop, elidable=True),
    ]
