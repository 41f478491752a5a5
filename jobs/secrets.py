"""Secrets in task arguments: referenced, never stored.

A job's (or an enqueued run's) ``args``/``kwargs`` may hold ``{"$secret": "NAME"}`` anywhere a value
goes. What is stored, shown to viewers (API, dashboard, admin, ``jobs export``) and written to the
audit log is that reference; the node resolves it just before it calls the task, from

    the environment variable SCHEDULER_SECRET_<NAME>, else
    the file <SCHEDULER_SECRETS_DIR>/<NAME> (a Kubernetes secret volume, Docker secrets), its
    trailing newline dropped.

A secret set on no node fails the run with a message naming it (never its value).

Plain secrets are refused when a job is saved (400, naming the field): a string under a key that
names a credential (``password``, ``token``, ``secret``, ``api_key``, ``authorization``,
``credentials``, ``private_key``, at any depth: an ``Authorization`` header too), and a URL with a
password in it (``https://user:pass@host``). Both say to use a reference instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from django.conf import settings

REFERENCE_KEY = "$secret"
NAME_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# Keys whose plain string values are credentials.
SENSITIVE_KEY = re.compile(
    r"pass(word|wd|phrase)|secret|token|api[-_]?key|authorization|credential|private[-_]?key",
    re.IGNORECASE,
)
# scheme://user:password@host
URL_WITH_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE)
ENV_PREFIX = "SCHEDULER_SECRET_"

ERR_PLAIN = 'looks like a credential: pass it as {{"$secret": "NAME"}} (see the README, Secrets)'
ERR_URL_PASSWORD = (
    'a URL with a password in it: move the password to a secret ({{"$secret": "NAME"}}) or a header'
)
ERR_NAME = "secret names are upper-case letters, digits and _ (starting with a letter), up to 64"
ERR_REFERENCE = '{"$secret": ...} takes exactly one key, the secret\'s name'


class SecretMissing(Exception):
    """A referenced secret is not set on this node."""


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and REFERENCE_KEY in value


def problems(value: Any, path: str) -> list[tuple[str, str]]:
    """(field path, reason) for every plain credential and bad reference in ``value``."""
    found: list[tuple[str, str]] = []
    _walk(value, path, None, found)
    return found


def _walk(value: Any, path: str, key: str | None, found: list[tuple[str, str]]) -> None:
    if is_reference(value):
        name = value[REFERENCE_KEY]
        if len(value) != 1:
            found.append((path, ERR_REFERENCE))
        elif not isinstance(name, str) or not NAME_PATTERN.match(name):
            found.append((path, ERR_NAME))
        return
    if isinstance(value, dict):
        for child_key, child in value.items():
            _walk(child, f"{path}.{child_key}", str(child_key), found)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            _walk(child, f"{path}.{index}", None, found)
    elif isinstance(value, str) and value:
        if key is not None and SENSITIVE_KEY.search(key):
            found.append((path, ERR_PLAIN))
        elif URL_WITH_PASSWORD.search(value):
            found.append((path, ERR_URL_PASSWORD))


def placeholders(value: Any) -> Any:
    """``value`` with each reference replaced by a stand-in string (for checking a call against
    its task before any secret is known)."""
    if is_reference(value):
        return f"<secret {value.get(REFERENCE_KEY)}>"
    if isinstance(value, dict):
        return {k: placeholders(v) for k, v in value.items()}
    if isinstance(value, list):
        return [placeholders(v) for v in value]
    return value


def resolve(value: Any) -> Any:
    """``value`` with each reference replaced by the secret (SecretMissing if one is not set)."""
    if is_reference(value):
        return lookup(value[REFERENCE_KEY])
    if isinstance(value, dict):
        return {k: resolve(v) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def lookup(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise SecretMissing(f"{name!r} is not a secret name")
    from_env = os.environ.get(ENV_PREFIX + name)
    if from_env is not None:
        return from_env
    directory = settings.SCHEDULER_SECRETS_DIR
    if directory:
        path = Path(directory) / name
        try:
            return path.read_text(encoding="utf-8").rstrip("\r\n")
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise SecretMissing(f"secret {name} could not be read ({exc.strerror})") from None
    where = f"{ENV_PREFIX}{name}" + (f" or {directory}/{name}" if directory else "")
    raise SecretMissing(f"secret {name} is not set on this node ({where})")


def resolve_call(args: list, kwargs: dict) -> tuple[list, dict]:
    return resolve(args), resolve(kwargs)
