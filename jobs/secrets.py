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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobs.conf import app_setting

REFERENCE_KEY = "$secret"
NAME_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# A key names a credential when its last word does (``access_token``, ``X-Api-Key``,
# ``clientSecret``), not when a credential word is only part of it (``max_tokens``,
# ``token_url``, ``secret_name``).
SENSITIVE_LAST_WORDS = {
    "password",
    "passwd",
    "passphrase",
    "pass",
    "pwd",
    "secret",
    "token",
    "authorization",
    "credential",
    "credentials",
    "apikey",
}
# ... or these two words end it.
SENSITIVE_PAIRS = {("api", "key"), ("private", "key"), ("secret", "key"), ("access", "key")}
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# scheme://user:password@host
URL_WITH_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@", re.IGNORECASE)
ENV_PREFIX = "SCHEDULER_SECRET_"

ERR_PLAIN = (
    'looks like a credential: pass it as {"$secret": "NAME"} (see docs/security.md, Secrets)'
)
ERR_URL_PASSWORD = (
    'a URL with a password in it: move the password to a secret ({"$secret": "NAME"}) or a header'
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
    _walk(value, path, False, found)
    return found


def _replace_references(value: Any, replace: Callable[[Any], Any]) -> Any:
    """``value`` with each reference replaced by ``replace(its name)``."""
    if is_reference(value):
        return replace(value.get(REFERENCE_KEY))
    if isinstance(value, dict):
        return {k: _replace_references(v, replace) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_references(v, replace) for v in value]
    return value


def referenced(value: Any) -> set[str]:
    """The secret names ``value`` refers to."""
    names: set[str] = set()
    _collect_references(value, names)
    return names


def _collect_references(value: Any, names: set[str]) -> None:
    """(A walk that copies nothing: every run's arguments are looked at.)"""
    if is_reference(value):
        name = value.get(REFERENCE_KEY)
        if isinstance(name, str):
            names.add(name)
    elif isinstance(value, dict):
        for child in value.values():
            _collect_references(child, names)
    elif isinstance(value, list):
        for child in value:
            _collect_references(child, names)


def names_a_credential(key: str) -> bool:
    words = [word.lower() for word in _WORDS.findall(key)]
    if not words:
        return False
    return words[-1] in SENSITIVE_LAST_WORDS or tuple(words[-2:]) in SENSITIVE_PAIRS


def _walk(value: Any, path: str, sensitive: bool, found: list[tuple[str, str]]) -> None:
    """``sensitive``: the nearest key above names a credential (a list under it is too)."""
    if is_reference(value):
        name = value[REFERENCE_KEY]
        if len(value) != 1:
            found.append((path, ERR_REFERENCE))
        elif not isinstance(name, str) or not NAME_PATTERN.match(name):
            found.append((path, ERR_NAME))
        return
    if isinstance(value, dict):
        for child_key, child in value.items():
            _walk(child, f"{path}.{child_key}", names_a_credential(str(child_key)), found)
    elif isinstance(value, list):
        for index, child in enumerate(value):
            _walk(child, f"{path}.{index}", sensitive, found)
    elif sensitive and value not in (None, "", True, False):
        found.append((path, ERR_PLAIN))  # a string or a number under a credential's name
    elif isinstance(value, str) and URL_WITH_PASSWORD.search(value):
        found.append((path, ERR_URL_PASSWORD))


def placeholders(value: Any) -> Any:
    """``value`` with each reference replaced by a stand-in string (for checking a call against
    its task before any secret is known)."""
    return _replace_references(value, lambda name: f"<secret {name}>")


def resolve(value: Any) -> Any:
    """``value`` with each reference replaced by the secret (SecretMissing if one is not set)."""
    return _replace_references(value, lookup)


def lookup(name: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise SecretMissing(f"{name!r} is not a secret name")
    from_env = os.environ.get(ENV_PREFIX + name)
    if from_env is not None:
        return from_env
    directory = app_setting("SCHEDULER_SECRETS_DIR")
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


def resolve_call(args: list, kwargs: dict) -> tuple[list, dict, list[str]]:
    """The call's arguments with their secrets, and the secret values revealed (to ``scrub``
    from what the run records)."""
    # Always copies: a task that changes its arguments must not change its job's (a job's
    # definition is shared by the runs a node claims). One walk per argument list copies and
    # resolves together (every run of a node goes through here).
    found: dict[str, str] = {}

    def reveal(name: Any) -> str:
        if not isinstance(name, str):
            return lookup(name)  # not a name: SecretMissing says so
        if name not in found:
            found[name] = lookup(name)
        return found[name]

    resolved = (_replace_references(args, reveal), _replace_references(kwargs, reveal))
    return resolved[0], resolved[1], list(found.values())


# A revealed value shorter than this is not scrubbed (it would mangle ordinary text).
SCRUB_MIN_CHARS = 4
SCRUBBED = "[secret]"


def scrub(value: Any, revealed: list[str]) -> Any:
    """``value`` (text, or a JSON-like result) with every revealed secret replaced: what a task
    returns, prints or raises (an error message quoting its argument) is stored and shown to
    viewers, and must not carry the secret it was given."""
    secrets_ = [s for s in revealed if len(s) >= SCRUB_MIN_CHARS]
    if not secrets_:
        return value
    if isinstance(value, str):
        for secret in sorted(secrets_, key=len, reverse=True):
            value = value.replace(secret, SCRUBBED)
        return value
    if isinstance(value, dict):
        return {scrub(k, secrets_): scrub(v, secrets_) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, secrets_) for v in value]
    return value
