"""URLs of the REST API and its documentation, to include where the API should live:
``path("api/", include("dashboard.api_urls"))`` (the pages find it by the name ``api-root``).

Every route has a name of its own (``job-detail``, ``api-schema``): no namespace, so a project
includes it once. The API's authentication, permissions and error answers are DRF settings
(``jobs.api.settings``): this module refuses to load when the role permission is not the default
one, rather than serve the API open."""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.routers import DefaultRouter
from rest_framework.settings import api_settings

from cluster.api import ClusterStateView, NodeViewSet, TermViewSet
from jobs.api.settings import ROLE_PERMISSION
from jobs.api.views import (
    AuditEventViewSet,
    ExecutionViewSet,
    JobViewSet,
    NotificationRuleViewSet,
    QueueViewSet,
    SchedulePreviewView,
    TaskCatalogView,
)

_permissions = [f"{c.__module__}.{c.__qualname__}" for c in api_settings.DEFAULT_PERMISSION_CLASSES]
if ROLE_PERMISSION not in _permissions:
    raise ImproperlyConfigured(
        "the scheduler's API needs its own DRF settings (its permission is missing from "
        "REST_FRAMEWORK): set REST_FRAMEWORK = jobs.api.settings.rest_framework()"
    )


class _SignInFirst:
    """A docs page opened signed out sends the browser to sign in (and back), instead of a blank
    "401 Unauthorized" page; the schema itself still answers 401 to API clients."""

    def dispatch(self, request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        # Before DRF's own checks (which answer 401): a browser without a session, not an API
        # client presenting a token.
        if not request.user.is_authenticated and "HTTP_AUTHORIZATION" not in request.META:
            return redirect_to_login(request.get_full_path())
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


class SwaggerDocs(_SignInFirst, SpectacularSwaggerSplitView):
    """Its start-up script is served as a file of its own (?script): no inline script (CSP)."""


class RedocDocs(_SignInFirst, SpectacularRedocView):
    pass


router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("nodes", NodeViewSet, basename="node")
router.register("terms", TermViewSet, basename="term")
router.register("audit-events", AuditEventViewSet, basename="auditevent")
router.register("notification-rules", NotificationRuleViewSet, basename="notificationrule")
router.register("queues", QueueViewSet, basename="queue")

urlpatterns = [
    path("cluster/", ClusterStateView.as_view(), name="cluster-state"),
    path("schedule-preview/", SchedulePreviewView.as_view(), name="schedule-preview"),
    path("tasks/", TaskCatalogView.as_view(), name="task-catalog"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SwaggerDocs.as_view(url_name="api-schema"), name="api-docs"),
    path("redoc/", RedocDocs.as_view(url_name="api-schema"), name="api-redoc"),
    path("", include(router.urls)),
]
