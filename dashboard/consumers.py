"""The dashboard's WebSocket (docs/live-protocol.md): authenticate, then forward the live feed.

The feed itself (what changed, when, to whom) lives in ``dashboard.live``; this consumer checks access,
sends the first snapshot, relays client requests and forwards the poller's frames.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from dashboard import live

logger = logging.getLogger(__name__)


def _execution_id(value: Any) -> int | None:
    """A positive id from a client message (a number, or digits as a string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    registered = False
    closed = False
    # The poller sends frames straight to this consumer (same process, same event loop); until
    # hello and the snapshot are out they wait here, so that they always come first.
    ready = False
    pending: list[str]

    async def connect(self) -> None:
        user = self.scope.get("user")
        code, role = await database_sync_to_async(live.dashboard_access)(
            user, self.scope.get("session")
        )
        # Accept before refusing: a close before the handshake reaches the browser as a bare
        # failure (1006), without the 4401/4403 that tells it what to do.
        await self.accept()
        if code is not None:
            await self._close(code)
            return
        # Register first, snapshot after: a change made in between arrives as a frame, not lost.
        self.pending = []
        await live.register(
            self.channel_name,
            user_id=user.pk,
            session_key=self.scope["session"].session_key,
            deliver=self.deliver_frames,
            revoke=self._close,
        )
        self.registered = True
        hello = {"user": user.get_username(), "role": role, "server_time": timezone.now()}
        await self.send(text_data=live.frame("hello", hello))
        for text in await database_sync_to_async(live.snapshot_frames)():
            await self.send(text_data=text)
        while self.pending and not self.closed:
            frames, self.pending = self.pending, []
            await self._send_frames(frames)
        self.ready = True

    async def disconnect(self, code: int) -> None:
        if self.registered:
            self.registered = False
            await live.unregister(self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            return
        try:
            content = json.loads(text_data)
        except ValueError:
            logger.debug("dashboard sent a frame that is not JSON; ignored")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or not self.registered:
            return
        if "ping" in content:
            await self.send(text_data=live.frame("pong", content["ping"]))
        if (execution_id := _execution_id(content.get("subscribe_execution"))) is not None:
            live.subscribe(self.channel_name, execution_id)
        if (execution_id := _execution_id(content.get("unsubscribe_execution"))) is not None:
            live.unsubscribe(self.channel_name, execution_id)

    # --- from the poller (dashboard.live) ------------------------------------------------------------
    async def deliver_frames(self, frames: list[str]) -> None:
        if not self.ready:
            self.pending.extend(frames)
            return
        await self._send_frames(frames)

    async def _send_frames(self, frames: list[str]) -> None:
        for text in frames:
            if self.closed:
                return
            await self.send(text_data=text)

    async def _close(self, code: int) -> None:
        if not self.closed:
            self.closed = True
            await self.close(code=code)
