"""WebSocket routes of the dashboard's live feed, and the ASGI application that serves them.

The live feed lives under the pages' own prefix (the pages connect to ``<prefix>ws/dashboard/``):
a project that includes ``dashboard.urls`` at ``"ops/scheduler/"`` routes its WebSockets with
``websocket_application("ops/scheduler/")``::

    application = ProtocolTypeRouter({
        "http": get_asgi_application(),
        "websocket": websocket_application("ops/scheduler/"),
    })
"""

from __future__ import annotations

from typing import Any

from django.urls import path

from dashboard.consumers import DashboardConsumer


def websocket_urls(prefix: str = "") -> list[Any]:
    """The live feed's route under ``prefix`` (the one ``dashboard.urls`` is included at: "" or
    ending in "/")."""
    if prefix and not prefix.endswith("/"):
        raise ValueError(f"a prefix ends with '/' (got {prefix!r})")
    return [path(f"{prefix.lstrip('/')}ws/dashboard/", DashboardConsumer.as_asgi())]


def websocket_application(prefix: str = "") -> Any:
    """The ASGI application of the live feed: same-origin only (the Origin checked against
    ALLOWED_HOSTS), then the session's user, then the route under ``prefix``."""
    from channels.auth import AuthMiddlewareStack
    from channels.routing import URLRouter
    from channels.security.websocket import AllowedHostsOriginValidator

    return AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urls(prefix))))


websocket_urlpatterns = websocket_urls()
