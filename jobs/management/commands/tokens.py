"""API tokens: ``tokens issue USER [--name N] [--days D | --no-expiry] [--rotate]``, ``tokens list``,
``tokens revoke USER [--prefix P]``.

Keys are stored as digests (``jobs.tokens``): ``issue`` prints the key once, and nothing can show
it again. A user may hold several keys (rotate without downtime: issue a new one, move the clients,
revoke the old one by its prefix); ``--rotate`` revokes the user's other keys as it issues. ``list``
shows each key's prefix, name, expiry and last use. Every issue and revocation is in the audit log
(source ``cli``), never the key. An unknown user or a bad option is a message and exit 2."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.utils import timezone

from jobs import tokens
from jobs.models import ApiToken, AuditSource
from jobs.services import Actor

EXIT_USAGE = 2
CLI = Actor(source=AuditSource.CLI)
ERR_NO_USER = "no user {username!r}"
ERR_NO_TOKEN = "{username} has no token{which}"
ERR_DAYS = "--days must be a positive number of days"


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value else "-"


class Command(BaseCommand):
    help = "Issue, list and revoke API tokens (stored hashed; a key is shown once)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        issue = actions.add_parser("issue", help="Issue a key (printed once)")
        issue.add_argument("username")
        issue.add_argument("--name", default="", help="What the key is for (shown by list)")
        lifetime = issue.add_mutually_exclusive_group()
        lifetime.add_argument(
            "--days",
            type=int,
            help="Expires after this many days (default SCHEDULER_TOKEN_TTL_DAYS)",
        )
        lifetime.add_argument("--no-expiry", action="store_true", help="Never expires")
        issue.add_argument(
            "--rotate", action="store_true", help="Also revoke the user's other keys"
        )
        actions.add_parser("list", help="Keys by user: prefix, name, created, expires, last used")
        revoke = actions.add_parser("revoke", help="Delete a user's keys")
        revoke.add_argument("username")
        revoke.add_argument("--prefix", help="Only the key starting with this (from list)")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        if action == "list":
            now = timezone.now()
            for token in ApiToken.objects.select_related("user").order_by(
                "user__username", "created_at"
            ):
                state = "expired" if token.expired(now) else "valid"
                self.stdout.write(
                    "\t".join(
                        [
                            token.user.get_username(),
                            f"{token.prefix}…",
                            token.name or "-",
                            f"created {_when(token.created_at)}",
                            f"expires {_when(token.expires_at)}",
                            f"used {_when(token.last_used_at)}",
                            state,
                        ]
                    )
                )
            return
        username = options["username"]
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(ERR_NO_USER.format(username=username), returncode=EXIT_USAGE)
        if action == "revoke":
            prefix = options.get("prefix")
            try:
                gone = tokens.revoke(user, by=CLI, prefix=prefix)
            except ValueError as exc:
                raise CommandError(f"--prefix: {exc}", returncode=EXIT_USAGE) from exc
            if not gone:
                which = f" starting with {prefix!r}" if prefix else ""
                raise CommandError(
                    ERR_NO_TOKEN.format(username=username, which=which), returncode=EXIT_USAGE
                )
            self.stdout.write(f"revoked {'that token' if prefix else 'every token'} of {username}")
            return
        days = options.get("days")
        if days is not None and days <= 0:
            raise CommandError(ERR_DAYS, returncode=EXIT_USAGE)
        lifetime: Any = "default"
        if options.get("no_expiry"):
            lifetime = None
        elif days is not None:
            lifetime = timedelta(days=days)
        with transaction.atomic():
            rotated = options["rotate"] and tokens.revoke(user, by=CLI)
            key, token = tokens.issue(
                user,
                by=CLI,
                name=options["name"],
                lifetime=lifetime,
                action="token.rotate" if rotated else "token.create",
            )
        self.stdout.write(f"API token for {username}: {key}")
        self.stdout.write(f"  expires {_when(token.expires_at)}; it is not shown again")
