"""Create the first administrator with a random password, printed once (no password ships)."""

from __future__ import annotations

import os
import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from jobs.conf import app_setting

PASSWORD_BYTES = 18


class Command(BaseCommand):
    help = "Create an admin user with a random password if no superuser exists yet."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        users = get_user_model()
        password_file = app_setting("VAR_DIR") / "admin_password"
        if users.objects.filter(is_superuser=True).exists():
            hint = f" (initial password in {password_file})" if password_file.exists() else ""
            self.stdout.write(f"An administrator already exists{hint}.")
            return
        password = secrets.token_urlsafe(PASSWORD_BYTES)
        users.objects.create_superuser(username=username, email="", password=password)
        app_setting("VAR_DIR").mkdir(parents=True, exist_ok=True)
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        self.stdout.write(
            f"Created administrator '{username}' with password: {password}\n"
            f"(also saved to {password_file}, readable only by you; change it after logging in)"
        )
