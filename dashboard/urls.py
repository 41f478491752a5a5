"""URLs of the server-rendered dashboard, included where the dashboard should live (at the site
root in scheduler_project.urls; under a prefix in a project of one's own).

Every page and action is reached by its name in the ``dashboard`` namespace (``reverse`` in
Python, ``{% url %}`` in templates): the API's router has names of its own (``job-detail``)."""

from django.urls import path

from dashboard.views import audit, bulk, executions, jobs, nodes, overview, queues

app_name = "dashboard"

urlpatterns = [
    path("", overview.overview, name="home"),
    path("dashboard/stats.json", overview.stats_json, name="dashboard-stats"),
    path("jobs/", jobs.job_list, name="job-list"),
    path("jobs/bulk/", bulk.job_bulk, name="job-bulk"),
    path("jobs/new/", jobs.job_create, name="job-create"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job-detail"),
    path("jobs/<int:pk>/edit/", jobs.job_edit, name="job-edit"),
    path("jobs/<int:pk>/delete/", jobs.job_delete, name="job-delete"),
    path("jobs/<int:pk>/trigger/", jobs.job_trigger, name="job-trigger"),
    path("jobs/<int:pk>/pause/", jobs.job_pause, name="job-pause"),
    path("jobs/<int:pk>/resume/", jobs.job_resume, name="job-resume"),
    path("executions/", executions.execution_list, name="execution-list"),
    path("executions/bulk/", bulk.execution_bulk, name="execution-bulk"),
    path("executions/export.csv", executions.execution_export, name="execution-export"),
    path("executions/<int:pk>/", executions.execution_detail, name="execution-detail"),
    path("executions/<int:pk>/output.txt", executions.execution_output, name="execution-output"),
    path("executions/<int:pk>/cancel/", executions.execution_cancel, name="execution-cancel"),
    path("executions/<int:pk>/retry/", executions.execution_retry, name="execution-retry"),
    path("nodes/", nodes.node_list, name="node-list"),
    path("nodes/<int:pk>/", nodes.node_detail, name="node-detail"),
    path("nodes/<int:pk>/drain/", nodes.node_drain, name="node-drain"),
    path("nodes/<int:pk>/forget/", nodes.node_forget, name="node-forget"),
    path("queues/", queues.queue_list, name="queue-list"),
    path("queues/<str:name>/pause/", queues.queue_pause, name="queue-pause"),
    path("queues/<str:name>/resume/", queues.queue_resume, name="queue-resume"),
    path("audit/", audit.audit_list, name="audit-list"),
]
