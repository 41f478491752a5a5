"""A strict Content-Security-Policy on every page (a relaxed style rule on the API docs only), and
a chunked request body measured against the request cap: 413 over it, parsed like any other body
under it (Django REST framework read a body without a Content-Length as empty: a 400)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from jobs.models import Job
from scheduler_project.asgi import application
from scheduler_project.security import API_PAGES_POLICY, STRICT_POLICY

pytestmark = pytest.mark.django_db(transaction=True)


def directives(policy: str) -> dict[str, str]:
    return {part.split()[0]: part for part in (p.strip() for p in policy.split(";")) if part}


def test_the_strict_policy_allows_no_inline_script_or_style_and_no_framing() -> None:
    rules = directives(STRICT_POLICY)
    assert rules["script-src"] == "script-src 'self'"
    assert rules["style-src"] == "style-src 'self'"
    assert rules["frame-ancestors"] == "frame-ancestors 'none'"
    assert rules["object-src"] == "object-src 'none'"
    docs = directives(API_PAGES_POLICY)  # REST framework's pages, Swagger UI, Redoc
    assert docs["script-src"] == "script-src 'self'"  # the docs run no inline script either
    assert "'unsafe-inline'" in docs["style-src"]


@pytest.mark.parametrize(
    ("path", "policy"),
    [
        ("/login/", STRICT_POLICY),
        ("/admin/login/", STRICT_POLICY),
        ("/api-auth/login/", API_PAGES_POLICY),
    ],
)
def test_every_page_carries_a_policy(path: str, policy: str) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    assert response["Content-Security-Policy"] == policy


def test_the_dashboard_and_the_api_carry_it_signed_in(make_user: Callable[..., object]) -> None:
    client = Client()
    client.force_login(make_user("viewer"))
    for path in ("/", "/jobs/", "/nodes/", "/audit/"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response["Content-Security-Policy"] == STRICT_POLICY, path


def test_the_api_pages_allow_inline_styles_only(make_user: Callable[..., object]) -> None:
    client = Client()
    client.force_login(make_user("viewer"))
    for path in ("/api/docs/", "/api/redoc/", "/api/jobs/"):
        response = client.get(path, HTTP_ACCEPT="text/html")
        assert response.status_code == 200, path
        assert response["Content-Security-Policy"] == API_PAGES_POLICY, path
        assert b"<script>" not in response.content, path  # no inline script
        assert b"onclick=" not in response.content, path


async def post_chunked(path: str, token: str, body: bytes, chunk: int = 4096) -> tuple[int, bytes]:
    """POST ``body`` as daphne hands a chunked request to the application: no Content-Length,
    the body in several messages."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
            (b"authorization", f"Token {token}".encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    communicator = ApplicationCommunicator(application, scope)
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    for index, piece in enumerate(pieces):
        await communicator.send_input(
            {"type": "http.request", "body": piece, "more_body": index < len(pieces) - 1}
        )
    start = await communicator.receive_output(10)
    content = b""
    while True:
        message = await communicator.receive_output(10)
        content += message.get("body", b"")
        if not message.get("more_body"):
            break
    await communicator.wait(10)
    return start["status"], content


def job_body(name: str, padding: int = 0) -> bytes:
    return json.dumps(
        {
            "name": name,
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "description": "x" * padding,
        }
    ).encode()


@pytest.fixture
def admin_token(make_user: Callable[..., object]) -> str:
    from tests.conftest import api_key_for

    return api_key_for(make_user("admin"))


def test_a_chunked_body_under_the_cap_is_parsed_like_any_other(admin_token: str) -> None:
    status, content = async_to_sync(post_chunked)("/api/jobs/", admin_token, job_body("chunked-ok"))
    assert status == 201, content
    assert Job.objects.filter(name="chunked-ok").exists()


def test_a_chunked_body_over_the_cap_is_a_413_and_writes_nothing(
    admin_token: str, settings: object
) -> None:
    limit = settings.SCHEDULER_MAX_REQUEST_BYTES  # type: ignore[attr-defined]
    body = job_body("chunked-big", padding=limit)
    status, content = async_to_sync(post_chunked)("/api/jobs/", admin_token, body)
    assert status == 413, content
    assert json.loads(content)["code"] == "payload_too_large"
    assert not Job.objects.filter(name="chunked-big").exists()
