"""``Authorization: Token <key>`` against the hashed API tokens (``jobs.tokens``)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from jobs import tokens
from jobs.api.throttling import throttle_anonymous

KEYWORD = "Token"
ERR_MALFORMED = "Invalid token header: give 'Token <key>'."
ERR_INVALID = "Invalid token."
ERR_EXPIRED = "Token expired; ask an admin for a new one (manage.py tokens issue)."
ERR_INACTIVE = "User inactive or deleted."


class HashedTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        try:
            return self._authenticate(request)
        except AuthenticationFailed:
            # A refused key counts against the anonymous rate first: 429 past it (no unlimited
            # guessing), else the 401.
            throttle_anonymous(request, (request.parser_context or {}).get("view"))
            raise

    def _authenticate(self, request: Request) -> tuple[Any, Any] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed(ERR_MALFORMED)
        try:
            key = parts[1].decode()
        except UnicodeError as exc:
            raise AuthenticationFailed(ERR_MALFORMED) from exc
        token = tokens.find(key)
        if token is None:
            raise AuthenticationFailed(ERR_INVALID)
        if token.expired():
            raise AuthenticationFailed(ERR_EXPIRED)
        if not token.user.is_active:
            raise AuthenticationFailed(ERR_INACTIVE)
        tokens.mark_used(token)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return KEYWORD


class HashedTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes this authentication."""

    target_class = HashedTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'An API key, sent as "Token <key>" (manage.py tokens issue).',
        }
