"""API tokens: ``tokens issue USER [--rotate]``, ``tokens list``, ``tokens revoke USER``.

One token per user (DRF's token authentication). ``issue`` prints the key once; an existing token is
kept unless ``--rotate`` replaces it. ``list`` shows users and the first characters of their keys,
never a whole key. Every issue, rotation and revocation is in the audit log (source ``cli``), never
the key. An unknown user is a message and exit 2."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs.models import AuditSource
from jobs.services import Actor, audit_record

EXIT_USAGE = 2
CLI = Actor(source=AuditSource.CLI)
KEY_PREFIX_CHARS = 6
ERR_NO_USER = "no user {username!r}"
ERR_HAS_TOKEN = "{username} already has a token; pass --rotate to replace it"
ERR_NO_TOKEN = "{username} has no token"


class Command(BaseCommand):
    help = "Issue, list and revoke API tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        issue = actions.add_parser("issue", help="Issue a token (printed once)")
        issue.add_argument("username")
        issue.add_argument("--rotate", action="store_true", help="Replace an existing token")
        actions.add_parser("list", help="Users with a token (keys shortened)")
        revoke = actions.add_parser("revoke", help="Delete a user's token")
        revoke.add_argument("username")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        from rest_framework.authtoken.models import Token

        if action == "list":
            for token in Token.objects.select_related("user").order_by("user__username"):
                self.stdout.write(
                    f"{token.user.get_username()}\t{token.key[:KEY_PREFIX_CHARS]}…\t"
                    f"{token.created.isoformat(timespec='seconds')}"
                )
            return
        username = options["username"]
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(ERR_NO_USER.format(username=username), returncode=EXIT_USAGE)
        with transaction.atomic():
            existing = Token.objects.filter(user=user).first()
            if action == "revoke":
                if existing is None:
                    raise CommandError(
                        ERR_NO_TOKEN.format(username=username), returncode=EXIT_USAGE
                    )
                existing.delete()
                self._audit("token.revoke", user)
                self.stdout.write(f"revoked the token of {username}")
                return
            if existing is not None and not options["rotate"]:
                raise CommandError(ERR_HAS_TOKEN.format(username=username), returncode=EXIT_USAGE)
            if existing is not None:
                existing.delete()
            token = Token.objects.create(user=user)
            self._audit("token.rotate" if existing is not None else "token.create", user)
        self.stdout.write(f"API token for {username}: {token.key}")

    def _audit(self, action: str, user: Any) -> None:
        audit_record(
            by=CLI,
            action=action,
            object_type="user",
            object_id=user.pk,
            object_repr=user.get_username(),
        )
