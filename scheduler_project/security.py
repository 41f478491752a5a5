"""Response and request hardening that Django 5.2 does not do itself.

``ContentSecurityPolicyMiddleware``: every HTML answer carries a strict Content-Security-Policy.
The dashboard and the admin run no inline script and set no inline style attribute (meters get
their width from script, through the CSS object model, which a policy does not govern), so
``script-src 'self'`` and ``style-src 'self'`` hold on every page. The pages under
``/api/`` and ``/api-auth/`` are third-party pages (REST framework's browsable API, Swagger UI,
Redoc) full of inline styles: they alone may use inline styles, never inline script (REST
framework's logout link is rewritten as a form button in ``dashboard/templates/rest_framework/api.html``;
Swagger UI's start-up script is served as a file of its own).

``ChunkedBodyMiddleware``: a body sent with ``Transfer-Encoding: chunked`` has no
``Content-Length``, and Django REST framework reads such a body as empty (a 400 for missing
fields, however large the body). Its length is measured here, up to the request cap: over it is a
413, like a body whose declared length is over it; under it, the request goes on with its length
known, so it is parsed like any other.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse

from jobs.api.parsers import ERR_TOO_LARGE

STRICT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        # 'self' covers the dashboard's own WebSocket (ws:/wss: of the same host).
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
# Redoc shows its maker's logo from their CDN (an image: nothing runs from there); it parses the
# schema in a worker.
API_PAGES_POLICY = (
    STRICT_POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'").replace(
        "img-src 'self' data:", "img-src 'self' data: https://cdn.redoc.ly"
    )
    + "; worker-src 'self' blob:"
)
API_PAGES = ("/api/", "/api-auth/")


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            api = request.path.startswith(API_PAGES)
            response["Content-Security-Policy"] = API_PAGES_POLICY if api else STRICT_POLICY
        return response


class ChunkedBodyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not request.META.get("CONTENT_LENGTH"):
            try:
                # Django measures a body of unknown length against DATA_UPLOAD_MAX_MEMORY_SIZE
                # (the request cap) as it reads it.
                body = request.body
            except RequestDataTooBig:
                limit = settings.SCHEDULER_MAX_REQUEST_BYTES
                return HttpResponse(
                    json.dumps(
                        {"detail": ERR_TOO_LARGE.format(limit=limit), "code": "payload_too_large"}
                    ),
                    status=413,
                    content_type="application/json",
                )
            # Go on as if the length had been declared (the body is kept by the request).
            request.META["CONTENT_LENGTH"] = str(len(body))
        return self.get_response(request)
