from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.templatetags.static import static
from django.urls import include, path
from django.views.defaults import page_not_found
from django.views.generic import RedirectView

from scheduler_project import health


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """An address no route matches: JSON under /api/ (what every API answer is, e.g. an id that is
    not a number), the HTML page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


handler404 = not_found

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
    path("api/", include("dashboard.api_urls")),
    path("api-auth/", include("rest_framework.urls")),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on pages that name no icon (the admin, the browsable API).
    path(
        "favicon.ico",
        RedirectView.as_view(url=static("dashboard/img/favicon.svg"), permanent=True),
        name="favicon",
    ),
]
