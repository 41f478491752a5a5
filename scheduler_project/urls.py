from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.defaults import page_not_found
from django.views.generic import RedirectView
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerSplitView,
)
from rest_framework.routers import DefaultRouter

from cluster.api import ClusterStateView, NodeViewSet, TermViewSet
from jobs.api.views import (
    AuditEventViewSet,
    ExecutionViewSet,
    JobViewSet,
    SchedulePreviewView,
    TaskCatalogView,
)
from scheduler_project import health


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


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """An address no route matches: JSON under /api/ (what every API answer is, e.g. an id that is
    not a number), the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


handler404 = not_found

router = DefaultRouter()
router.register("jobs", JobViewSet, basename="job")
router.register("executions", ExecutionViewSet, basename="execution")
router.register("nodes", NodeViewSet, basename="node")
router.register("terms", TermViewSet, basename="term")
router.register("audit-events", AuditEventViewSet, basename="auditevent")

urlpatterns = [
    # The live dashboard (server-rendered pages fed by the /ws/dashboard/ WebSocket).
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    # Django's LogoutView accepts POST only: a link or an image tag cannot sign anyone out.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("dashboard.urls")),
    path("health/live", health.live, name="health-live"),
    path("health/ready", health.ready, name="health-ready"),
    path("api/cluster/", ClusterStateView.as_view(), name="cluster-state"),
    path("api/schedule-preview/", SchedulePreviewView.as_view(), name="schedule-preview"),
    path("api/tasks/", TaskCatalogView.as_view(), name="task-catalog"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SwaggerDocs.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", RedocDocs.as_view(url_name="api-schema"), name="api-redoc"),
    path("api/", include(router.urls)),
    path("api-auth/", include("rest_framework.urls")),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on pages that name no icon (the admin, the browsable API).
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("dashboard/img/favicon.svg"), permanent=True),
        name="favicon",
    ),
]
