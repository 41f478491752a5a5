"""Create (or update) a user with a scheduler role: viewer, operator or admin."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from jobs.roles import ROLES


class Command(BaseCommand):
    help = "Create a user with a role; prints a generated password unless --password is given."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", choices=ROLES, required=True)
        parser.add_argument("--password", help="Default: a random one, printed once")
        parser.add_argument("--token", action="store_true", help="Also print an API token")

    def handle(
        self, *args: Any, username: str, role: str, password: str | None, token: bool, **_: Any
    ) -> None:
        from rest_framework.authtoken.models import Token

        password = password or secrets.token_urlsafe(12)
        # Hashed before the transaction: on SQLite a write transaction holds the database-wide write
        # lock, and a second of hashing inside it stalls every node's lease and presence renewals.
        hashed = make_password(password)
        with transaction.atomic():
            user, created = get_user_model().objects.get_or_create(username=username)
            user.password = hashed
            user.is_staff = True  # may open the Django admin; the role decides what it can do there
            user.save()
            user.groups.remove(*Group.objects.filter(name__in=ROLES))
            user.groups.add(Group.objects.get_or_create(name=role)[0])
        self.stdout.write(
            f"{'created' if created else 'updated'} {username} ({role}); password: {password}"
        )
        if token:
            key = Token.objects.get_or_create(user=user)[0].key
            self.stdout.write(f"API token: {key}")
