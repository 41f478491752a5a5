"""WebSocket routes (served by daphne through scheduler_project.asgi)."""

from django.urls import path

from dashboard.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", DashboardConsumer.as_asgi()),
]
