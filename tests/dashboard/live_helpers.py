"""A dashboard tab for tests of the live feed: the real ASGI application through a
WebsocketCommunicator, signed in with a real session, with frames decoded."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from dashboard import live
from scheduler_project.asgi import application

ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")


def session_headers(user: Any | None) -> list[tuple[bytes, bytes]]:
    """Headers of a browser on the dashboard's own origin, logged in as ``user`` (None: anonymous)."""
    if user is None:
        return [ORIGIN, HOST]
    client = Client()
    client.force_login(user)
    key = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    return [ORIGIN, (b"cookie", f"sessionid={key}".encode()), HOST]


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        try:
            await body()
        finally:
            await live.shutdown()

    async_to_sync(main)()


class Dashboard:
    """One browser tab: a WebsocketCommunicator on /ws/dashboard/ that decodes the frames."""

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.comm = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)

    async def connect(self) -> tuple[bool, Any]:
        return await self.comm.connect()

    async def open(self) -> list[dict[str, Any]]:
        """Connect and return the first three frames (hello, cluster, counts)."""
        connected, _ = await self.connect()
        assert connected
        return [await self.next() for _ in range(3)]

    async def next(self, timeout: float = 1.0) -> dict[str, Any]:
        message = await self.comm.receive_output(timeout)
        if message["type"] == "websocket.close":
            return {"type": "<close>", "code": message.get("code")}
        assert message["type"] == "websocket.send"
        return json.loads(message["text"])

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 1.0
    ) -> dict[str, Any]:
        """The first frame within ``timeout`` that matches (earlier frames are skipped)."""
        deadline = time.monotonic() + timeout
        seen = []
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                message = await self.next(timeout=remaining)
            except TimeoutError:
                break
            if predicate(message):
                return message
            seen.append(message["type"])
        raise AssertionError(f"no matching frame within {timeout} s; got {seen}")

    async def assert_none(self, predicate: Callable[[dict[str, Any]], bool], during: float) -> None:
        """No matching frame for ``during`` seconds (without timing out the communicator, which
        would cancel the application)."""
        deadline = time.monotonic() + during
        while time.monotonic() < deadline:
            if await self.comm.receive_nothing(timeout=0.02):
                continue
            message = await self.next()
            assert not predicate(message), message

    async def close(self) -> None:
        await self.comm.disconnect()


def of_type(kind: str, test: Callable[[Any], bool] = lambda data: True) -> Callable:
    return lambda message: message["type"] == kind and test(message.get("data"))


def closed(message: dict[str, Any]) -> bool:
    return message["type"] == "<close>"
