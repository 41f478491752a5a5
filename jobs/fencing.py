"""Fencing that reaches the task: a run's token and key, and a fenced write to the shop's tables.

The scheduler fences its own writes (terms, claim tokens), but a lease cannot stop a task body: a
body frozen past its lease (a long GC, SIGSTOP, a lost network) is declared lost and run again
elsewhere, and when it resumes it still holds whatever it was about to write. The answer is a
token the storage checks (Kleppmann, "How to do distributed locking"): every run carries a
*fencing token* that grows with every run of its job, and the store keeps the largest token it
has accepted and refuses an older one.

- The token is the run's execution id. Runs are rows inserted in the order they come to be: a
  later fire of the job, or the retry of a run declared lost, is always a later row, so a run
  that supersedes another always has the larger token, across leaders, terms, nodes and
  attempts. It costs nothing to mint.
- The idempotency key names one attempt of one fire, ``<job id>:<slot>:<attempt>`` (or the
  enqueuer's own key and the attempt), for a service that deduplicates by key instead.

``fenced_update`` is the Django way to use the token on a table of your own: give the table an
integer column (``fencing_token`` by default) and write through it; a write carrying a token
older than the stored one changes nothing and raises :class:`StaleToken`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import Model, Q, QuerySet

DEFAULT_FIELD = "fencing_token"
ERR_STALE = (
    "fencing token {token} is older than the one {model} already holds: this run was superseded "
    "(declared lost and run again, or a later run has written); nothing was written"
)
ERR_TOKEN = "the fencing token must be a non-negative integer, got {token!r}"


class StaleToken(Exception):
    """A fenced write whose token is older than the stored one: the writer was superseded."""


def idempotency_key(
    *, job_id: int, scheduled_for: datetime, attempt: int, enqueue_key: str | None = None
) -> str:
    """The key of one attempt of one fire: the same for every claim of that attempt, on every
    node; a retry is another attempt and so another key."""
    if enqueue_key:
        return f"{enqueue_key}:{attempt}"
    return f"{job_id}:{scheduled_for.astimezone(UTC).isoformat()}:{attempt}"


def run_key(execution: Any) -> str:
    """``idempotency_key`` of a run (a ``JobExecution``)."""
    return idempotency_key(
        job_id=execution.job_id,
        scheduled_for=execution.scheduled_for,
        attempt=execution.attempt,
        enqueue_key=execution.idempotency_key,
    )


def fenced_update(
    target: QuerySet[Any] | Model, *, token: int, field: str = DEFAULT_FIELD, **values: Any
) -> int:
    """Write ``values`` (and ``field`` = ``token``) to the rows of ``target`` whose stored token
    is not newer than ``token``, in one conditional UPDATE. Returns how many rows were written.
    Raises StaleToken when ``target`` has rows but every one holds a newer token (nothing is
    written then). Rows with no token yet (NULL) accept any."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise ValueError(ERR_TOKEN.format(token=token))
    queryset = (
        type(target)._default_manager.filter(pk=target.pk) if isinstance(target, Model) else target
    )
    accepts = Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__lte": token})
    written = queryset.filter(accepts).update(**{field: token}, **values)
    if written == 0 and queryset.exists():
        raise StaleToken(ERR_STALE.format(token=token, model=queryset.model.__name__))
    return written
