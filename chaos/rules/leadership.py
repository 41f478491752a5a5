"""Rules on leadership: no fire written by a term older than one already begun (by timestamps;
``commit_order`` judges by the database's own log), no term held by two nodes, no gap without a
leader longer than its bound unless a fault excuses it."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import asdict

from chaos.record import (
    SCHEDULE_TRIGGER,
    CheckConfig,
    History,
    TermClaim,
    Violation,
    row_evidence,
)
from chaos.rules.recovery import leaderless

STALE_TERM_WRITE = "stale_term_write"  # a fire written by a leader after a newer term began
TERM_HELD_TWICE = "term_held_twice"  # one term held by two nodes
LEADER_GAP = "leader_gap"  # no leader for longer than the bound, with no fault to excuse it
MSG_STALE_WRITE = (
    "execution {execution_id}: created by term {term} {late_s:.3f} s after term {newer} began"
)
MSG_TERM_TWO_NODES = "term {term} claimed by several nodes: {nodes}"
MSG_TERM_ROW_OTHER_NODE = "term {term}: node {node} led it but its row names {row_node}"
MSG_LEADER_GAP = "no leader for {gap_s:.2f} s between term {before} and term {after}"
MSG_LEADER_GONE = "no leader for {gap_s:.2f} s after term {before} until the cluster stopped"


def overlap_s(start: float, end: float, windows: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in windows)


def blocking_windows(history: History, config: CheckConfig) -> list[tuple[float, float]]:
    return [
        (f.start, f.end + config.recovery_s)
        for f in history.faults
        if f.kind in config.leadership_blocking_faults
    ]


def stale_writes(history: History) -> list[Violation]:
    """(f) A fire created by a leader after a newer term had been acquired (the fence must have
    refused it). Retries copy their original's term and operator runs carry none: only the
    leader's own fires (schedule trigger, attempt 1) name the term that wrote them. A fire's
    ``created_at`` is the instant its tick began: a tick begun before the newer term and committed
    after it is the commit-order check's to find (``commit_order``, from the binlog)."""
    terms = sorted(history.terms, key=lambda t: t.term)
    numbers = [t.term for t in terms]
    # suffix[i]: the earliest acquisition among terms[i:], and which term it was.
    suffix: list[tuple[float, int]] = [(math.inf, 0)] * (len(terms) + 1)
    for i in range(len(terms) - 1, -1, -1):
        suffix[i] = min((terms[i].acquired_at, terms[i].term), suffix[i + 1])
    found = []
    for row in history.executions:
        if row.term is None or row.trigger != SCHEDULE_TRIGGER or row.attempt != 1:
            continue
        first_newer = bisect.bisect_right(numbers, row.term)
        acquired, newer = suffix[first_newer]
        if row.created_at > acquired:
            found.append(
                Violation(
                    STALE_TERM_WRITE,
                    MSG_STALE_WRITE.format(
                        execution_id=row.id,
                        term=row.term,
                        late_s=row.created_at - acquired,
                        newer=newer,
                    ),
                    {
                        "row": row_evidence(row),
                        "created_at": row.created_at,
                        "newer_acquired_at": acquired,
                    },
                )
            )
    return found


def terms_held_twice(history: History) -> list[Violation]:
    """(g) One term claimed by two nodes in their logs, or led by a node its row does not name."""
    found = []
    claims: dict[int, list[TermClaim]] = defaultdict(list)
    for claim in history.term_claims:
        claims[claim.term].append(claim)
    rows = {t.term: t for t in history.terms}
    for term, held in sorted(claims.items()):
        nodes = sorted({c.node_id for c in held})
        if len(nodes) > 1:
            found.append(
                Violation(
                    TERM_HELD_TWICE,
                    MSG_TERM_TWO_NODES.format(term=term, nodes=", ".join(nodes)),
                    {"claims": [asdict(c) for c in held]},
                )
            )
        row = rows.get(term)
        for node in nodes:
            if row is not None and row.node_id != node:
                found.append(
                    Violation(
                        TERM_HELD_TWICE,
                        MSG_TERM_ROW_OTHER_NODE.format(term=term, node=node, row_node=row.node_id),
                        {"row": asdict(row), "claims": [asdict(c) for c in held]},
                    )
                )
    return found


def leader_gaps(history: History, config: CheckConfig) -> tuple[list[Violation], float]:
    """(h) Time without a leader beyond the bound, outside windows a fault made leaderless."""
    blocked = blocking_windows(history, config)
    terms = {t.term: t for t in history.terms}
    found = []
    longest = 0.0
    for stretch in leaderless(history):
        if stretch.start < history.window_start:
            continue
        gap = stretch.end - stretch.start
        counted = gap - overlap_s(stretch.start, stretch.end, blocked)
        longest = max(longest, counted)
        if counted <= config.leader_gap_bound_s:
            continue
        before = asdict(terms[stretch.before])
        if stretch.after is None:
            message = MSG_LEADER_GONE.format(gap_s=gap, before=stretch.before)
            evidence = {"before": before, "effective_end": stretch.start, "stop_at": stretch.end}
        else:
            message = MSG_LEADER_GAP.format(gap_s=gap, before=stretch.before, after=stretch.after)
            evidence = {
                "before": before,
                "effective_end": stretch.start,
                "after": asdict(terms[stretch.after]),
                "excused_s": gap - counted,
            }
        found.append(Violation(LEADER_GAP, message, evidence))
    return found, longest
