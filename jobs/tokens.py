"""API tokens: issued, checked, revoked. Only a key's SHA-256 digest is stored (the key is random,
256 bits: a fast hash is enough, and nothing in the database can be replayed as a key). Every issue
and revocation is audited, never the key.

A key is ``<prefix><secret>``: the prefix is stored as well, so ``tokens list`` and the admin can
show which key is which. Keys expire after ``SCHEDULER_TOKEN_TTL_DAYS`` unless issued with another
lifetime (0: never)."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.conf import app_setting
from jobs.models import ApiToken

PREFIX_CHARS = 8
# A prefix given to revoke one key must be at least this long (an empty one would match all).
MIN_PREFIX_CHARS = 4
# last_used_at is written at most this often per token (a write per request would be a hot row).
LAST_USED_EVERY = timedelta(minutes=1)


def new_key() -> str:
    """A random key (256 bits) that does not start with "-": its prefix is typed on command lines
    (``tokens revoke --prefix``), where a leading dash reads as an option."""
    while (key := secrets.token_urlsafe(32))[0] == "-":
        pass
    return key


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def default_lifetime() -> timedelta | None:
    days = app_setting("SCHEDULER_TOKEN_TTL_DAYS")
    return timedelta(days=days) if days > 0 else None


def issue(
    user: Any,
    *,
    by: Any,
    name: str = "",
    lifetime: timedelta | str | None = "default",
    action: str = "token.create",
) -> tuple[str, ApiToken]:
    """A new key for ``user``; returns (the key, shown once; its row). ``lifetime`` None: never
    expires."""
    from jobs.services import audit_record

    key = new_key()
    ttl = default_lifetime() if lifetime == "default" else lifetime
    now = timezone.now()
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name,
            prefix=key[:PREFIX_CHARS],
            digest=digest(key),
            created_at=now,
            expires_at=now + ttl if isinstance(ttl, timedelta) else None,
        )
        audit_record(
            by=by,
            action=action,
            object_type="user",
            object_id=user.pk,
            object_repr=user.get_username(),
            changes={
                "token": [None, f"{token.prefix}…"],
                "expires_at": [None, _iso(token.expires_at)],
            },
        )
    return key, token


def revoke(user: Any, *, by: Any, prefix: str | None = None) -> int:
    """Delete ``user``'s tokens (only the one starting with ``prefix`` when given); returns how
    many went."""
    from jobs.services import audit_record

    if prefix is not None and len(prefix) < MIN_PREFIX_CHARS:
        raise ValueError(f"a prefix names a key by at least {MIN_PREFIX_CHARS} characters")
    with transaction.atomic():
        tokens = ApiToken.objects.filter(user=user)
        if prefix is not None:
            tokens = tokens.filter(prefix__startswith=prefix[:PREFIX_CHARS])
        gone = [f"{t.prefix}…" for t in tokens]
        tokens.delete()
        if gone:
            audit_record(
                by=by,
                action="token.revoke",
                object_type="user",
                object_id=user.pk,
                object_repr=user.get_username(),
                changes={"token": [", ".join(gone), None]},
            )
    return len(gone)


def find(key: str) -> ApiToken | None:
    """The token row of ``key`` (with its user), or None. Expiry is the caller's to judge."""
    return ApiToken.objects.select_related("user").filter(digest=digest(key)).first()


def mark_used(token: ApiToken, now: datetime | None = None) -> None:
    now = now or timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now


def _iso(value: datetime | None) -> str | None:
    return value.isoformat(timespec="seconds") if value else None
