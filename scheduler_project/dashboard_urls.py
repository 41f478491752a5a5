"""URLs of the server-rendered dashboard (mounted at the site root by scheduler_project.urls)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from cluster import views as cluster_views
from jobs import views

urlpatterns = [
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="registration/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    # Django's LogoutView accepts POST only: a link or an image tag cannot sign anyone out.
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="home"),
    path("dashboard/stats.json", views.stats_json, name="dashboard-stats"),
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/bulk/", views.job_bulk, name="job-bulk"),
    path("jobs/new/", views.job_create, name="job-create"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/edit/", views.job_edit, name="job-edit"),
    path("jobs/<int:pk>/delete/", views.job_delete, name="job-delete"),
    path("jobs/<int:pk>/trigger/", views.job_trigger, name="job-trigger"),
    path("jobs/<int:pk>/pause/", views.job_pause, name="job-pause"),
    path("jobs/<int:pk>/resume/", views.job_resume, name="job-resume"),
    path("executions/", views.execution_list, name="execution-list"),
    path("executions/bulk/", views.execution_bulk, name="execution-bulk"),
    path("executions/<int:pk>/", views.execution_detail, name="execution-detail"),
    path("executions/<int:pk>/output.txt", views.execution_output, name="execution-output"),
    path("executions/<int:pk>/cancel/", views.execution_cancel, name="execution-cancel"),
    path("executions/<int:pk>/retry/", views.execution_retry, name="execution-retry"),
    path("nodes/", cluster_views.node_list, name="node-list"),
    path("nodes/<int:pk>/", cluster_views.node_detail, name="node-detail"),
    path("nodes/<int:pk>/drain/", cluster_views.node_drain, name="node-drain"),
    path("nodes/<int:pk>/forget/", cluster_views.node_forget, name="node-forget"),
    path("audit/", views.audit_list, name="audit-list"),
]
