"""Django admin for jobs, executions and the audit trail.

Every change goes through jobs.services (so it is validated the same way as the API and audited);
roles decide what a staff user may do: viewer reads, operator runs actions, admin edits.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from jobs import notifications, services, tokens
from jobs.definition import RULES, WRITABLE_FIELDS
from jobs.models import (
    ApiToken,
    AuditEvent,
    AuditSource,
    Job,
    JobExecution,
    Notification,
    NotificationEvent,
    NotificationRule,
)
from jobs.roles import ADMIN, OPERATOR, VIEWER, has_role
from jobs.validation import JobValidationError, clean_job


def admin_actor(request: HttpRequest) -> services.Actor:
    return services.Actor(
        user=request.user, source=AuditSource.ADMIN, remote_addr=request.META.get("REMOTE_ADDR")
    )


class RoleAdminMixin:
    """Model permissions come from the scheduler roles, not per-model Django permissions."""

    editable = True

    def has_module_permission(self, request: HttpRequest) -> bool:
        return request.user.is_staff and has_role(request.user, VIEWER)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff and has_role(request.user, VIEWER)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return self.editable and request.user.is_staff and has_role(request.user, ADMIN)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.editable and request.user.is_staff and has_role(request.user, ADMIN)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.editable and request.user.is_staff and has_role(request.user, ADMIN)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.is_staff and has_role(request.user, OPERATOR)


class JobAdminForm(forms.ModelForm):
    expected_version = forms.IntegerField(widget=forms.HiddenInput, required=False)

    class Meta:
        model = Job
        fields = [f for f in WRITABLE_FIELDS]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, rule in RULES.items():  # the same words as the API schema and the dashboard
            if name in self.fields:
                self.fields[name].help_text = rule.help
        if self.instance.pk:
            self.fields["expected_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors:
            return data
        submitted = {field: data.get(field) for field in WRITABLE_FIELDS if field in data}
        current = services.job_snapshot(self.instance) if self.instance.pk else None
        if current is not None:
            # The form posts every field: send only what the form says changed (it compares like
            # its widgets, e.g. date-times to the second), so fields of another schedule type that
            # the form left filled are not taken as explicit input.
            submitted = {k: v for k, v in submitted.items() if k in self.changed_data}
            expected = data.get("expected_version")
            if expected is not None and expected != self.instance.version:
                raise forms.ValidationError(
                    services.ERR_VERSION_CONFLICT.format(
                        expected=expected, current=self.instance.version
                    )
                )
        else:
            submitted = {k: v for k, v in submitted.items() if v not in (None, "")}
        from django.utils import timezone

        try:
            self.cleaned_values = clean_job(submitted, now=timezone.now(), current=current)
        except JobValidationError as exc:
            for field, reasons in exc.errors.items():
                for reason in reasons:
                    self.add_error(field if field in self.fields else None, reason)
        self.submitted = submitted
        return data


@admin.register(Job)
class JobAdmin(RoleAdminMixin, admin.ModelAdmin):
    form = JobAdminForm
    list_display = [
        "name",
        "task",
        "schedule_type",
        "enabled",
        "next_fire_at",
        "last_fire_at",
        "queue",
        "concurrency_policy",
    ]
    list_filter = ["enabled", "schedule_type", "task", "queue", "concurrency_policy"]
    search_fields = ["name", "description", "task"]
    readonly_fields = ["next_fire_at", "last_fire_at", "version", "created_at", "updated_at"]
    actions = ["pause_jobs", "resume_jobs", "trigger_jobs"]

    def save_model(self, request: HttpRequest, obj: Job, form: JobAdminForm, change: bool) -> None:
        if change:
            saved = services.job_update(
                job_id=obj.pk,
                expected_version=form.cleaned_data.get("expected_version") or obj.version,
                changes=form.submitted,
                by=admin_actor(request),
            )
        else:
            saved = services.job_create(data=form.submitted, by=admin_actor(request))
        obj.pk = saved.pk
        obj.refresh_from_db()

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple:
        # A job's executions go with it: deleting a job needs the admin role on jobs only, not a
        # delete permission on executions (which are read-only in the admin).
        deleted, model_count, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, model_count, set(), protected

    def delete_model(self, request: HttpRequest, obj: Job) -> None:
        services.job_delete(job_id=obj.pk, by=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        for job_id in queryset.values_list("pk", flat=True):
            services.job_delete(job_id=job_id, by=admin_actor(request))

    def _each(self, request: HttpRequest, queryset: QuerySet[Job], service: Any, verb: str) -> None:
        count = 0
        for job_id in queryset.values_list("pk", flat=True):
            service(job_id=job_id, by=admin_actor(request))
            count += 1
        self.message_user(request, f"{verb} {count} job(s).", messages.SUCCESS)

    @admin.action(description="Pause selected jobs", permissions=["operate"])
    def pause_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_pause, "Paused")

    @admin.action(description="Resume selected jobs", permissions=["operate"])
    def resume_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_resume, "Resumed")

    @admin.action(description="Run selected jobs now", permissions=["operate"])
    def trigger_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_trigger, "Triggered")


@admin.register(JobExecution)
class JobExecutionAdmin(RoleAdminMixin, admin.ModelAdmin):
    editable = False
    list_display = [
        "id",
        "job",
        "scheduled_for",
        "attempt",
        "status",
        "trigger",
        "node",
        "started_at",
        "duration_ms",
    ]
    list_filter = ["status", "trigger", "queue", "node"]
    search_fields = ["job__name", "node", "claim_token", "error"]
    date_hierarchy = "scheduled_for"
    list_select_related = ["job"]
    actions = ["cancel_executions", "retry_executions"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in JobExecution._meta.fields]

    def _each(self, request: HttpRequest, queryset: QuerySet, service: Any, verb: str) -> None:
        done, refused = 0, []
        for execution_id in queryset.values_list("pk", flat=True):
            try:
                service(execution_id=execution_id, by=admin_actor(request))
                done += 1
            except services.ActionNotAllowed as exc:
                refused.append(f"#{execution_id}: {exc}")
        self.message_user(request, f"{verb} {done} execution(s).", messages.SUCCESS)
        for line in refused:
            self.message_user(request, line, messages.WARNING)

    @admin.action(description="Cancel selected executions", permissions=["operate"])
    def cancel_executions(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, services.execution_cancel, "Cancelled")

    @admin.action(description="Retry selected executions", permissions=["operate"])
    def retry_executions(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._each(request, queryset, services.execution_retry, "Retried")


@admin.register(AuditEvent)
class AuditEventAdmin(RoleAdminMixin, admin.ModelAdmin):
    editable = False
    list_display = ["created_at", "actor_name", "action", "object_type", "object_repr", "source"]
    list_filter = ["source", "object_type", "action"]
    search_fields = ["actor_name", "object_repr", "object_id", "action"]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in AuditEvent._meta.fields]


@admin.register(ApiToken)
class ApiTokenAdmin(RoleAdminMixin, admin.ModelAdmin):
    """API keys, by prefix: the key itself is not stored (issued by ``manage.py tokens issue``,
    shown once). Admins may revoke one here (audited); nobody can read or add one."""

    editable = False
    list_display = ["user", "prefix", "name", "created_at", "expires_at", "last_used_at"]
    list_filter = ["user"]
    search_fields = ["user__username", "prefix", "name"]
    exclude = ["digest"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in ApiToken._meta.fields if f.name != "digest"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_staff and has_role(request.user, ADMIN)

    def delete_model(self, request: HttpRequest, obj: ApiToken) -> None:
        tokens.revoke(obj.user, by=admin_actor(request), prefix=obj.prefix)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for token in queryset.select_related("user"):
            tokens.revoke(token.user, by=admin_actor(request), prefix=token.prefix)


# REST framework's own token table only feeds the migration that hashes its keys: never shown.
try:
    from rest_framework.authtoken.models import TokenProxy

    admin.site.unregister(TokenProxy)
except (ImportError, admin.sites.NotRegistered):
    pass


class NotificationRuleForm(forms.ModelForm):
    events = forms.MultipleChoiceField(
        choices=NotificationEvent.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="Runs whose final attempt ended so.",
    )

    class Meta:
        model = NotificationRule
        fields = ["name", "job", "events", "channel", "target", "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        problems = notifications.check_rule(
            events=list(data.get("events") or []),
            channel=data.get("channel") or "",
            target=data.get("target") or "",
        )
        for field, reasons in problems.items():
            for reason in reasons:
                self.add_error(field, reason)
        return data


@admin.register(NotificationRule)
class NotificationRuleAdmin(RoleAdminMixin, admin.ModelAdmin):
    """Who is told when a run ends badly (admins edit; every change is audited)."""

    form = NotificationRuleForm
    list_display = ["name", "job", "events", "channel", "target", "enabled"]
    list_filter = ["channel", "enabled"]
    search_fields = ["name", "target"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        services.audit_record(
            by=admin_actor(request),
            action="notification_rule.update" if change else "notification_rule.create",
            object_type="notification_rule",
            object_id=obj.pk,
            object_repr=obj.name,
            # Before and after of each changed field (before: what the form was opened with).
            changes={
                field: [
                    None if not change else str(form.initial.get(field)),
                    str(form.cleaned_data.get(field)),
                ]
                for field in form.changed_data
            },
        )

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        pk, name = obj.pk, obj.name
        super().delete_model(request, obj)
        services.audit_record(
            by=admin_actor(request),
            action="notification_rule.delete",
            object_type="notification_rule",
            object_id=pk,
            object_repr=name,
            changes={},
        )


@admin.register(Notification)
class NotificationAdmin(RoleAdminMixin, admin.ModelAdmin):
    """What was sent (or is to be, or failed after its last try), read-only."""

    editable = False
    list_display = ["created_at", "rule", "execution", "event", "status", "attempts", "sent_at"]
    list_filter = ["status", "event", "rule"]
    search_fields = ["rule__name", "last_error"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Notification._meta.fields]
