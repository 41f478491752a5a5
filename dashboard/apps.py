from django.apps import AppConfig


class DashboardConfig(AppConfig):
    """The web tier: the server-rendered pages and the live feed of their WebSocket. It depends
    on ``cluster`` and ``jobs``; neither depends on it."""

    name = "dashboard"
    verbose_name = "Dashboard"
