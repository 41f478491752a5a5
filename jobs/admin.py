"""Django admin for jobs, executions and the audit trail (longer than most modules: Django's admin
classes for every model of the app, each thin, calling the services).

Every change goes through jobs.services (so it is validated the same way as the API and audited);
roles decide what a staff user may do: viewer reads, operator runs actions, admin edits. Users and
groups keep Django's own admin (and its permissions: a superuser edits them), with every create,
change and delete audited too.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import is_password_usable
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from jobs import notifications, queues, services, tokens
from jobs.definition import RULES, WRITABLE_FIELDS
from jobs.forms import DepthSafeJSONField
from jobs.models import (
    ApiToken,
    AuditEvent,
    AuditSource,
    Job,
    JobExecution,
    Notification,
    NotificationEvent,
    NotificationRule,
    Queue,
)
from jobs.roles import ADMIN, OPERATOR, VIEWER, has_role, user_role
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
        field_classes = {"args": DepthSafeJSONField, "kwargs": DepthSafeJSONField}

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
            services.job_check_chains(
                values=self.cleaned_values, old_name=current["name"] if current else None
            )
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

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A job another job chains to is not deleted from under it: say so on the job's page.
        try:
            return super().delete_view(request, object_id, extra_context)
        except services.ActionNotAllowed as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:jobs_job_change", args=[unquote(object_id)]))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        refused = []
        for job_id in queryset.values_list("pk", flat=True):
            try:
                services.job_delete(job_id=job_id, by=admin_actor(request))
            except services.ActionNotAllowed as exc:
                refused.append(str(exc))
        for reason in refused:
            self.message_user(request, reason, messages.ERROR)

    def _each(self, request: HttpRequest, queryset: QuerySet[Job], service: Any, verb: str) -> None:
        count = 0
        for job_id in queryset.values_list("pk", flat=True):
            service(job_id=job_id, by=admin_actor(request))
            count += 1
        self.message_user(request, f"{verb} {count} job(s).", messages.SUCCESS)

    def _set_enabled(
        self, request: HttpRequest, queryset: QuerySet[Job], enabled: bool, verb: str, why: str
    ) -> None:
        """Count only the jobs this changed; name the ones that already were so."""
        changed, unchanged = 0, []
        for job_id in queryset.values_list("pk", flat=True):
            job, did = services.job_set_enabled(
                job_id=job_id, enabled=enabled, by=admin_actor(request)
            )
            if did:
                changed += 1
            else:
                unchanged.append(job.name)
        self.message_user(request, f"{verb} {changed} job(s).", messages.SUCCESS)
        if unchanged:
            self.message_user(
                request,
                f"Unchanged {len(unchanged)} job(s) ({why}): {', '.join(unchanged)}.",
                messages.INFO,
            )

    @admin.action(description="Pause selected jobs", permissions=["operate"])
    def pause_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, False, "Paused", "already paused")

    @admin.action(description="Resume selected jobs", permissions=["operate"])
    def resume_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._set_enabled(request, queryset, True, "Resumed", "not paused")

    @admin.action(description="Run selected jobs now", permissions=["operate"])
    def trigger_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_trigger, "Triggered")


class QueueAdminForm(forms.ModelForm):
    """The same checks as the API's, each error on its field (nothing written)."""

    class Meta:
        model = Queue
        fields = ["name", "max_concurrent", "rate_limit", "rate_period_seconds", "paused"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        checks = [lambda: queues.clean_settings({k: data[k] for k in queues.SETTINGS if k in data})]
        if "name" in self.fields:
            checks.append(lambda: queues.check_name(data.get("name")))
        for check in checks:
            try:
                check()
            except JobValidationError as exc:
                for field, messages_ in exc.errors.items():
                    self.add_error(field if field in self.fields else None, " ".join(messages_))
        return data


@admin.register(Queue)
class QueueAdmin(RoleAdminMixin, admin.ModelAdmin):
    """A queue's flow control (admins edit; operators pause and resume); each change audited
    through the same service as the API's."""

    form = QueueAdminForm
    list_display = ["name", "max_concurrent", "rate_limit", "rate_period_seconds", "paused"]
    list_filter = ["paused"]
    search_fields = ["name"]
    fields = ["name", "max_concurrent", "rate_limit", "rate_period_seconds", "paused"]
    actions = ["pause_queues", "resume_queues"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return ["name"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: Queue, form: Any, change: bool) -> None:
        data = {field: form.cleaned_data[field] for field in queues.SETTINGS}
        saved = queues.queue_set(name=obj.name, data=data, by=admin_actor(request), partial=False)
        obj.updated_at = saved.updated_at

    def delete_model(self, request: HttpRequest, obj: Queue) -> None:
        queues.queue_delete(name=obj.name, by=admin_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for name in queryset.values_list("name", flat=True):
            queues.queue_delete(name=name, by=admin_actor(request))

    @admin.action(description="Pause selected queues", permissions=["operate"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            queues.queue_pause(name=queue.name, by=admin_actor(request))
        self.message_user(request, f"Paused {queryset.count()} queue(s).", messages.SUCCESS)

    @admin.action(description="Resume selected queues", permissions=["operate"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        for queue in queryset:
            queues.queue_resume(name=queue.name, by=admin_actor(request))
        self.message_user(request, f"Resumed {queryset.count()} queue(s).", messages.SUCCESS)


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
        return [*(f.name for f in JobExecution._meta.fields), "chained_runs_list"]

    @admin.display(description="Chained runs")
    def chained_runs_list(self, obj: JobExecution) -> str:
        """The runs this run's final outcome made through its job's chains."""
        runs = obj.chained_runs.select_related("job").order_by("id")
        return ", ".join(str(run) for run in runs) or "—"

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
        help_text="Runs whose final attempt ended so; a success after a failure (recovered); a "
        "start later than late_after_seconds (late start).",
    )

    class Meta:
        model = NotificationRule
        fields = ["name", "job", "events", "late_after_seconds", "channel", "target", "enabled"]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        problems = notifications.check_rule(
            events=list(data.get("events") or []),
            channel=data.get("channel") or "",
            target=data.get("target") or "",
            late_after_seconds=data.get("late_after_seconds"),
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

    # A webhook URL carries its credential: only admins (who edit rules) read it whole, or search
    # by it; everyone else sees its scheme and host (notifications.redact_url).
    def _sees_targets(self, request: HttpRequest) -> bool:
        return has_role(request.user, ADMIN)

    def _shown(self, request: HttpRequest, fields: Any) -> list[str]:
        if self._sees_targets(request):
            return list(fields)
        return ["target_redacted" if f == "target" else f for f in fields]

    @admin.display(description="target")
    def target_redacted(self, obj: NotificationRule) -> str:
        return notifications.redact_url(obj.target)

    def get_list_display(self, request: HttpRequest) -> list[str]:
        return self._shown(request, super().get_list_display(request))

    def get_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return self._shown(request, super().get_fields(request, obj))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        extra = [] if self._sees_targets(request) else ["target_redacted"]
        return [*super().get_readonly_fields(request, obj), *extra]

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        fields = super().get_search_fields(request)
        return list(fields) if self._sees_targets(request) else [f for f in fields if f != "target"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)

        def shown(field: str, value: Any) -> str:
            # Everyone reads the audit log: a webhook URL is recorded without its credential.
            return notifications.redact_url(str(value)) if field == "target" else str(value)

        services.audit_record(
            by=admin_actor(request),
            action="notification_rule.update" if change else "notification_rule.create",
            object_type="notification_rule",
            object_id=obj.pk,
            object_repr=obj.name,
            # Before and after of each changed field (before: what the form was opened with).
            changes={
                field: [
                    None if not change else shown(field, form.initial.get(field)),
                    shown(field, form.cleaned_data.get(field)),
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


# --- users and groups: Django's admin, audited ------------------------------------------------------

PASSWORD_SET = "(set)"  # what the audit log says of a password: never the password or its hash
PASSWORD_CHANGED = "(changed)"
PASSWORD_UNUSABLE = "(unusable)"
USER_FIELDS = (
    "username",
    "first_name",
    "last_name",
    "email",
    "is_active",
    "is_staff",
    "is_superuser",
)
_EMPTY = (None, "", [])


def _permission_names(permissions: QuerySet) -> list[str]:
    return sorted(
        f"{p.content_type.app_label}.{p.codename}"
        for p in permissions.select_related("content_type")
    )


def user_snapshot(user: Any) -> dict[str, Any]:
    """What the audit log records of a user (as stored): its flags, groups, permissions and the
    scheduler role they make."""
    fresh = type(user)._default_manager.get(pk=user.pk)  # no cached role, the saved groups
    snapshot = {field: getattr(fresh, field) for field in USER_FIELDS}
    snapshot["groups"] = sorted(fresh.groups.values_list("name", flat=True))
    snapshot["user_permissions"] = _permission_names(fresh.user_permissions.all())
    snapshot["role"] = user_role(fresh)
    return snapshot


def group_snapshot(group: Group) -> dict[str, Any]:
    fresh = Group.objects.get(pk=group.pk)
    return {
        "name": fresh.name,
        "permissions": _permission_names(fresh.permissions.all()),
        # Never edited on the group's page, so only a delete reports them: it takes their role.
        "members": sorted(fresh.user_set.values_list("username", flat=True)),
    }


class AuditedAdminMixin:
    """Audit rows (source admin) for a model admin's create, change and delete: the before and after
    of each field of ``snapshot`` that changed. Read after the form's many-to-many fields are saved
    (``save_related``), so group and permission changes are in it; a save that changed nothing
    writes no row."""

    audit_type: str
    snapshot: Any  # (obj) -> dict[str, Any]

    def _audit(self, request: HttpRequest, action: str, obj: Model, changes: dict) -> None:
        services.audit_record(
            by=admin_actor(request),
            action=f"{self.audit_type}.{action}",
            object_type=self.audit_type,
            object_id=obj.pk,
            object_repr=str(obj),
            changes=changes,
        )

    def created_changes(self, obj: Model) -> dict[str, list]:
        return {}

    def save_model(self, request: HttpRequest, obj: Model, form: Any, change: bool) -> None:
        # The form has already written its values onto ``obj``: "before" is read from the database.
        request._audit_before = type(self).snapshot(obj) if change else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        obj = form.instance
        after = type(self).snapshot(obj)
        if change:
            before = getattr(request, "_audit_before", {})
            changes = {k: [before.get(k), v] for k, v in after.items() if before.get(k) != v}
            if changes:
                self._audit(request, "update", obj, changes)
        else:
            changes = {k: [None, v] for k, v in after.items() if v not in _EMPTY}
            self._audit(request, "create", obj, {**changes, **self.created_changes(obj)})

    def _audit_deletes(self, request: HttpRequest, objs: Any) -> None:
        # Written before the rows go (an admin deleting their own user is still the actor).
        for obj in objs:
            before = type(self).snapshot(obj)
            self._audit(
                request, "delete", obj, {k: [v, None] for k, v in before.items() if v not in _EMPTY}
            )

    def delete_model(self, request: HttpRequest, obj: Model) -> None:
        with transaction.atomic():
            self._audit_deletes(request, [obj])
            super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        with transaction.atomic():
            self._audit_deletes(request, list(queryset))
            super().delete_queryset(request, queryset)


class AuditedUserAdmin(AuditedAdminMixin, auth_admin.UserAdmin):
    audit_type = "user"
    snapshot = staticmethod(user_snapshot)

    def created_changes(self, obj: Model) -> dict[str, list]:
        usable = is_password_usable(obj.password)
        return {"password": [None, PASSWORD_SET if usable else PASSWORD_UNUSABLE]}

    def user_change_password(
        self, request: HttpRequest, id: str, form_url: str = ""
    ) -> HttpResponse:
        user = self.get_object(request, unquote(id))
        with transaction.atomic():
            response = super().user_change_password(request, id, form_url)
            if user is not None and request.method == "POST":
                after = type(user)._default_manager.get(pk=user.pk).password
                if after != user.password:
                    before = (
                        PASSWORD_SET if is_password_usable(user.password) else PASSWORD_UNUSABLE
                    )
                    now = PASSWORD_CHANGED if is_password_usable(after) else PASSWORD_UNUSABLE
                    self._audit(request, "update", user, {"password": [before, now]})
        return response


class AuditedGroupAdmin(AuditedAdminMixin, auth_admin.GroupAdmin):
    audit_type = "group"
    snapshot = staticmethod(group_snapshot)


for _model, _admin in ((get_user_model(), AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
