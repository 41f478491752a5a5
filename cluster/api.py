"""REST API for nodes and the cluster state."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster import selectors, services
from cluster.models import LeadershipTerm, SchedulerNode
from jobs.api.views import actor_from
from jobs.roles import OPERATOR


class NodeSerializer(serializers.ModelSerializer):
    degraded_reason = serializers.SerializerMethodField(
        help_text=(
            "Why a node alive in the coordination backend cannot do its work (its database is "
            "unreachable); empty when it can. The dashboard shows such a node as degraded."
        )
    )

    def get_degraded_reason(self, node: SchedulerNode) -> str:
        degraded = self.context.get("degraded")
        if degraded is None:
            degraded = selectors.degraded_nodes([node], now=timezone.now())
        return degraded.get(node.node_id, "")

    class Meta:
        model = SchedulerNode
        fields = [
            "id",
            "node_id",
            "hostname",
            "pid",
            "version",
            "queues",
            "started_at",
            "last_heartbeat",
            "status",
            "capacity",
            "running_count",
            "drain_requested",
            "heartbeat_interval_s",
            "dead_after_s",
            "degraded_reason",
        ]
        read_only_fields = fields


class TermSerializer(serializers.ModelSerializer):
    end_reason = serializers.ChoiceField(
        choices=LeadershipTerm._meta.get_field("end_reason").choices,
        allow_blank=True,
        read_only=True,
        help_text="Why the term ended; empty while it is open.",
    )

    class Meta:
        model = LeadershipTerm
        fields = ["term", "node_id", "acquired_at", "ended_at", "end_reason"]
        read_only_fields = fields


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Scheduler nodes (viewer) and the drain action (operator)."""

    queryset = SchedulerNode.objects.all()
    serializer_class = NodeSerializer
    filterset_fields = ["status"]
    role_by_action = {"drain": OPERATOR, "forget": OPERATOR}

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        node = services.node_request_drain(node_pk=self.get_object().pk, by=actor_from(request))
        return Response(NodeSerializer(node).data)

    @extend_schema(request=None, responses={204: None})
    @action(detail=True, methods=["post"])
    def forget(self, request: Request, pk: str | None = None) -> Response:
        """Remove a dead or stopped node from the list (409 while it is active or holds runs)."""
        services.node_forget(node_pk=self.get_object().pk, by=actor_from(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TermViewSet(viewsets.ReadOnlyModelViewSet):
    """Leadership terms, newest first (the leadership timeline)."""

    queryset = LeadershipTerm.objects.all()
    serializer_class = TermSerializer
    filterset_fields = ["node_id"]


class BehindSerializer(serializers.Serializer):
    since = serializers.FloatField(help_text="Since when (Unix seconds, the cluster's time).")
    fires_s = serializers.IntegerField(
        help_text="How far past due the earliest fire not yet written is (seconds)."
    )
    claims_s = serializers.IntegerField(
        help_text="How long the oldest due run has waited unclaimed (seconds)."
    )
    waiting = serializers.IntegerField(
        help_text="Due runs unclaimed past the warning threshold (at most 1,000 counted)."
    )
    why = serializers.ListField(child=serializers.CharField())


class ClusterStateView(APIView):
    """The leader, its term, node counts by status, and how far behind schedule the cluster is
    (``behind``: null while it keeps up)."""

    @extend_schema(
        responses=inline_serializer(
            "ClusterState",
            {
                "leader": serializers.CharField(allow_null=True),
                "term": serializers.IntegerField(allow_null=True),
                "leader_since": serializers.DateTimeField(allow_null=True),
                "coordination": serializers.CharField(),
                "nodes": serializers.DictField(child=serializers.IntegerField()),
                "behind": BehindSerializer(allow_null=True),
                "time": serializers.DateTimeField(),
            },
        )
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.cluster_state())
