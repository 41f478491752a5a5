"""In-process change notifications, always sent after the transaction commits.

The scheduler subscribes to ``job_changed`` to wake up early; the dashboard subscribes to both to
push updates. A receiver never sees a state that the database rolled back.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from django.db import transaction
from django.dispatch import Signal


class ExecutionChange(NamedTuple):
    execution_id: int
    job_id: int
    status: str


# kwargs: job_id (int), change (str: created, updated, deleted, paused, resumed, triggered)
job_changed = Signal()
# kwargs: changes (list[ExecutionChange]): the executions one transaction changed, sent once for
# all of them (a batch of 500 claimed or finished runs is one signal, not 500).
executions_changed = Signal()


def send_after_commit(signal: Signal, **payload: Any) -> None:
    transaction.on_commit(lambda: signal.send_robust(sender=None, **payload))
