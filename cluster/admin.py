"""Django admin for nodes, terms and coordination rows: read-only; nodes can be asked to drain."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from cluster import services
from cluster.models import ClusterFence, CoordinationLease, LeadershipTerm, SchedulerNode
from jobs.admin import RoleAdminMixin, admin_actor
from jobs.services import ActionNotAllowed


class ReadOnlyAdmin(RoleAdminMixin, admin.ModelAdmin):
    editable = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in self.model._meta.fields]


@admin.register(SchedulerNode)
class SchedulerNodeAdmin(ReadOnlyAdmin):
    list_display = [
        "node_id",
        "hostname",
        "pid",
        "status",
        "last_heartbeat",
        "capacity",
        "running_count",
        "drain_requested",
    ]
    list_filter = ["status"]
    search_fields = ["node_id", "hostname"]
    actions = ["drain_nodes"]

    @admin.action(description="Drain selected nodes", permissions=["operate"])
    def drain_nodes(self, request: HttpRequest, queryset: QuerySet) -> None:
        for pk in queryset.values_list("pk", flat=True):
            try:
                node = services.node_request_drain(node_pk=pk, by=admin_actor(request))
                self.message_user(request, f"Drain requested for {node.node_id}.", messages.SUCCESS)
            except ActionNotAllowed as exc:
                self.message_user(request, str(exc), messages.WARNING)


@admin.register(LeadershipTerm)
class LeadershipTermAdmin(ReadOnlyAdmin):
    list_display = ["term", "node_id", "acquired_at", "ended_at", "end_reason"]
    list_filter = ["end_reason"]
    search_fields = ["node_id"]


@admin.register(ClusterFence)
class ClusterFenceAdmin(ReadOnlyAdmin):
    list_display = ["name", "term"]


@admin.register(CoordinationLease)
class CoordinationLeaseAdmin(ReadOnlyAdmin):
    list_display = ["name", "holder", "term", "expires_at_ms"]
    search_fields = ["name", "holder"]
