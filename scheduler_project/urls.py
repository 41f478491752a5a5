from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from cluster.api import ClusterStateView, NodeViewSet, TermViewSet
from jobs.api.views import AuditEventViewSet, ExecutionViewSet, JobViewSet, SchedulePreviewView
from scheduler_project import health

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("nodes", NodeViewSet, basename="node")
router.register("terms", TermViewSet, basename="term")
router.register("audit-events", AuditEventViewSet, basename="auditevent")

urlpatterns = [
    # The live dashboard (server-rendered pages fed by the /ws/dashboard/ WebSocket).
    path("", include("scheduler_project.dashboard_urls")),
    path("health/live", health.live, name="health-live"),
    path("health/ready", health.ready, name="health-ready"),
    path("api/cluster/", ClusterStateView.as_view(), name="cluster-state"),
    path("api/schedule-preview/", SchedulePreviewView.as_view(), name="schedule-preview"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include(router.urls)),
    path("api-auth/", include("rest_framework.urls")),
    path("admin/", admin.site.urls),
]
