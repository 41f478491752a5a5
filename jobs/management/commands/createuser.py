"""Create a user with a scheduler role (viewer, operator or admin), or with ``--update`` change an
existing one's role (an existing user is never changed without it). ``--update`` keeps the user's
password unless ``--password`` (set this one) or ``--reset-password`` (a generated one) is given.

A password given with ``--password`` must pass the configured password validators (a weak one is
refused with exit 2); a generated one (a new user without ``--password``, or ``--reset-password``)
is printed once. Every change (user created or updated, role set, password set, key issued) is
written to the audit log, source ``cli``; the password and the token themselves never are."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from jobs import tokens
from jobs.models import AuditSource
from jobs.roles import ROLES, user_role
from jobs.services import Actor, audit_record

EXIT_USAGE = 2
CLI = Actor(source=AuditSource.CLI)
PASSWORD_SET = "(set)"  # what the audit log says of a password: never the password
ERR_EXISTS = (
    "user {username!r} exists; pass --update to change its role (and --password or "
    "--reset-password to change its password)"
)
ERR_TWO_PASSWORDS = "give --password or --reset-password, not both"
ERR_RESET_NEW = "--reset-password is for --update of an existing user (a new one gets a password)"
PASSWORD_UNCHANGED = "unchanged"


class Command(BaseCommand):
    help = "Create a user with a role; prints a generated password unless --password is given."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=ROLES, required=True)
        parser.add_argument(
            "--password",
            help="Default: a random one, printed once, for a new user; with --update: unchanged",
        )
        parser.add_argument(
            "--reset-password",
            action="store_true",
            help="With --update: set a new random password (printed once)",
        )
        parser.add_argument(
            "--token", action="store_true", help="Also issue an API key (printed once)"
        )
        parser.add_argument(
            "--update",
            action="store_true",
            help="Change an existing user's role (refused without it); keeps its password",
        )

    def handle(
        self,
        *args: Any,
        username: str,
        role: str,
        password: str | None,
        token: bool,
        update: bool = False,
        reset_password: bool = False,
        **_: Any,
    ) -> None:
        model = get_user_model()
        try:
            model.username_validator(username)
        except ValidationError as exc:
            raise CommandError(
                f"username: {' '.join(exc.messages)}", returncode=EXIT_USAGE
            ) from exc
        if password is not None and reset_password:
            raise CommandError(ERR_TWO_PASSWORDS, returncode=EXIT_USAGE)
        existing = model.objects.filter(username=username).first()
        if existing is not None and not update:
            raise CommandError(ERR_EXISTS.format(username=username), returncode=EXIT_USAGE)
        if existing is None and reset_password:
            raise CommandError(ERR_RESET_NEW, returncode=EXIT_USAGE)
        if password is not None:
            try:
                password_validation.validate_password(
                    password, user=existing or model(username=username)
                )
            except ValidationError as exc:
                raise CommandError(
                    f"password: {' '.join(exc.messages)}", returncode=EXIT_USAGE
                ) from exc
        # An existing user keeps its password unless told otherwise (a role change is not a reset).
        if password is None and (existing is None or reset_password):
            password = secrets.token_urlsafe(12)
        # Hashed before the transaction: on SQLite a write transaction holds the database-wide write
        # lock, and a second of hashing inside it stalls every node's lease and presence renewals.
        hashed = make_password(password) if password is not None else None
        with transaction.atomic():
            user, created = model.objects.get_or_create(username=username)
            before = None if created else user_role(user)
            changes: dict[str, list] = {}
            if created or before != role:
                changes["role"] = [before, role]
            if hashed is not None:
                user.password = hashed
                changes["password"] = [None, PASSWORD_SET]
            if not created and not user.is_staff:
                changes["is_staff"] = [False, True]
            user.is_staff = True  # may open the Django admin; the role decides what it can do there
            user.save()
            user.groups.remove(*Group.objects.filter(name__in=ROLES))
            user.groups.add(Group.objects.get_or_create(name=role)[0])
            if changes:
                audit_record(
                    by=CLI,
                    action="user.create" if created else "user.update",
                    object_type="user",
                    object_id=user.pk,
                    object_repr=username,
                    changes=changes,
                )
            key = kept = None
            if token:
                # One key from here: a user who has a valid one keeps it (it cannot be shown
                # again; a new one is issued by ``tokens issue``). Expired ones do not count.
                kept = next(
                    (t for t in user.api_tokens.order_by("-created_at") if not t.expired()), None
                )
                if kept is None:
                    key = tokens.issue(user, by=CLI, name="createuser")[0]
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({role}); "
            f"password: {password if password is not None else PASSWORD_UNCHANGED}"
        )
        if key is not None:
            self.stdout.write(f"API token: {key}")
        elif kept is not None:
            self.stdout.write(
                f"API token: kept ({kept.prefix}…); `manage.py tokens issue {username}` for a new one"
            )
