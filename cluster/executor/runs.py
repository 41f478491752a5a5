"""What the executor tracks about a run, from its claim to its written outcome; and the reasons it
records."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from cluster.coordination import LockWatchdog
from jobs import registry
from jobs.models import JobExecution

REASON_TIMEOUT = "exceeded timeout of {seconds} s"
REASON_LOCK_LOST = "job lock lost while running"
REASON_CANCELLED = "cancelled"
REASON_SHUT_DOWN = "node {node} shut down before the run finished"
REASON_UNTRACKED = "node {node} lost track of the run (an error in its hot path)"
REASON_BLOCKER_GONE = "node {node} is gone (its presence expired) while the run was active"


@dataclass(order=True)
class Scheduled:
    """A claimed run, ordered by the instant it is due."""

    due: float
    seq: int
    execution: JobExecution = field(compare=False)
    # The node's membership epoch when it claimed the run: a lapse since voids the claim.
    epoch: int = field(default=0, compare=False)
    # Admission batches that failed with this run in them (the database went away mid-batch).
    failures: int = field(default=0, compare=False)
    # The run of its job found blocking it at its last look (see ``admission.Facts``).
    seen_blocker: int | None = field(default=None, compare=False)


@dataclass(order=True)
class Waiting:
    """A claimed run admission told to wait (a job lock about to free, an older fire first)."""

    look_at: float
    seq: int
    item: Scheduled = field(compare=False)


@dataclass
class ActiveRun:
    """A run admitted to start: from its row marked ``running`` until its outcome is queued."""

    execution: JobExecution
    due: float
    cancel_event: threading.Event = field(default_factory=threading.Event)
    deadline: float | None = None  # monotonic; set when the body starts
    lock: LockWatchdog | None = None
    process: Any = None
    context: registry.TaskContext | None = None
    outcome_reason: str = ""
    # Opened at the due instant (shared by the runs due together); None: wait for ``due`` alone.
    gate: threading.Event | None = None
    # After a cancel request, a thread-mode task has until then to return (its output is kept).
    cancel_deadline: float | None = None
    # An outcome was queued: later ones (a late body, a timeout) are dropped.
    completed: bool = False
    # The run holds one of its node's body slots (at most ``capacity`` bodies run at once), and
    # since when it has waited for one (wall clock; None: it has not asked yet).
    body_slot: bool = False
    room_wait_from: float | None = None
    # Its job lock was given up while its body ran (its node could no longer do its work): the
    # body runs on, unrecorded until it returns, and the node names the run in its presence.
    released: bool = False
    epoch: int = 0
    # The node's database outages counted when its admission marked it running (``NodeRow``): one
    # since means the leader may have taken it, and its row is read again before its body starts.
    outages: int = 0
    # Secret values the body was given: scrubbed from what is saved while it runs.
    revealed: list[str] = field(default_factory=list)
    # A process body's output so far, as its child last reported it (None: a thread body).
    streamed: str | None = None
    # The output saved while the run goes on: its length and when (monotonic).
    output_saved: int = 0
    output_saved_at: float = 0.0

    def output_size(self) -> int:
        if self.streamed is not None:
            return len(self.streamed)
        return self.context.size if self.context is not None else 0

    def output_so_far(self) -> str:
        if self.streamed is not None:
            return self.streamed
        return self.context.output if self.context is not None else ""


@dataclass
class Outcome:
    """How a run ended, as the finisher will write it."""

    run: ActiveRun
    status: str
    result: Any = None
    error: str = ""
    tb: str = ""
    output: str = ""
    reason: str = ""
    started: float | None = None  # wall-clock seconds the body started at
    # Wall-clock seconds the body ended at (None: the run was ended without its body saying so,
    # a timeout or a cancel: then the moment the outcome is written).
    ended: float | None = None
