from django.contrib import admin
from django.urls import include, path

# The shop's own routes, and the scheduler's pages and API under a prefix of the shop's choosing.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("ops/scheduler/", include("dashboard.urls")),
    path("ops/scheduler/api/", include("dashboard.api_urls")),
]
