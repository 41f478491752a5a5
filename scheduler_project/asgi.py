"""ASGI entry point: daphne serves HTTP (Django) and the dashboard's WebSocket (Channels)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "scheduler_project.settings")
# Django must be set up before anything imports models (consumers, routing).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

from cluster.startup import freeze_loaded  # noqa: E402
from dashboard.routing import websocket_application  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # The live feed, at the root as the pages are (scheduler_project.urls).
        "websocket": websocket_application(),
    }
)
freeze_loaded()
