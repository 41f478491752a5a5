"""Fencing that reaches the task, judged from the bodies' own lines: a body frozen (SIGSTOP), or
whose node was cut off from the database, while it ran, that wrote after a newer run of its job had
written through the fence must have its own fenced write refused (``jobs.fencing``: the row keeps
the largest token it accepted).

Only the fenced jobs' bodies write (``chaos.tasks.fenced_write``); their end lines carry the token,
``still_owner()`` just before the write, and "accepted", "refused" or "error: ..." (the database
did not answer: nothing to judge).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from chaos import faults
from chaos.record import History, SideEffect, Violation
from chaos.rules.overlaps import ALL_NODES_CUT, cuts_database

STALE_FENCED_WRITE = "stale_fenced_write"
KINDS = (STALE_FENCED_WRITE,)
# A newer run's write counts as "before" the frozen body's only with this much room (seconds):
# the lines are stamped just after each write, and two writes racing at the database may be
# logged in the other order.
ORDER_SLACK_S = 0.5
MSG_STALE = (
    "execution {execution_id} (job {job_id}, token {token}) was held by {fault} and its fenced "
    "write was accepted {late_s:.2f} s after token {newer} had been"
)


@dataclass
class FencedStats:
    writes: int = 0  # fenced writes made (end lines with an outcome)
    refused: int = 0
    errors: int = 0
    frozen: int = 0  # bodies frozen mid-run that wrote after a newer run had
    frozen_refused: int = 0
    frozen_still_owner: int = 0  # of those, how many believed they still held their claim


def fenced_writes(
    history: History, *, control_limit_s: float = 1.0
) -> tuple[list[Violation], FencedStats]:
    stats = FencedStats()
    starts = {e.execution_id: e for e in history.side_effects if e.event == "start"}
    ends = [e for e in history.side_effects if e.event == "end" and e.fenced]
    accepted: dict[int | None, list[SideEffect]] = defaultdict(list)
    for end in ends:
        stats.writes += 1
        stats.refused += end.fenced == "refused"
        stats.errors += end.fenced.startswith("error")
        if end.fenced == "accepted" and end.token is not None:
            accepted[end.job_id].append(end)
    # Bodies frozen mid-run, and bodies whose node was cut off from the database while they ran
    # (the node gives their job lock up and the cluster ends their runs: they run on as a
    # frozen body resumes).
    freezes = [
        f
        for f in history.faults
        if f.kind in faults.FREEZE_FAULTS or cuts_database(f, control_limit_s=control_limit_s)
    ]
    found = []
    for end in ends:
        start = starts.get(end.execution_id)
        if start is None or end.token is None or end.fenced.startswith("error"):
            continue
        fault = next(
            (
                f
                for f in freezes
                if (f.target == end.node or f.kind in ALL_NODES_CUT) and start.at < f.start < end.at
            ),
            None,
        )
        if fault is None:
            continue
        newer = [
            other
            for other in accepted[end.job_id]
            if other.token is not None
            and other.token > end.token
            and other.at < end.at - ORDER_SLACK_S
        ]
        if not newer:
            continue  # nobody newer had written: its write was the newest, rightly taken
        stats.frozen += 1
        stats.frozen_still_owner += bool(end.still_owner)
        if end.fenced == "refused":
            stats.frozen_refused += 1
            continue
        first = min(newer, key=lambda e: e.at)
        found.append(
            Violation(
                STALE_FENCED_WRITE,
                MSG_STALE.format(
                    execution_id=end.execution_id,
                    job_id=end.job_id,
                    token=end.token,
                    fault=fault.kind,
                    late_s=end.at - first.at,
                    newer=first.token,
                ),
                {"write": asdict(end), "newer": asdict(first), "fault": asdict(fault)},
            )
        )
    return found, stats
