"""The pure checker of the cluster's guarantees over a chaos run's history (chaos.record).

:func:`check` reads nothing but its argument and returns a :class:`Report` of violations by kind,
each with the evidence that shows it. Runs recorded ``lost`` are *indeterminate* (the body may or
may not have run), never violations by themselves, as long as a fault on their node explains them.
Each family of rules lives in a module of ``chaos/rules/`` (``runs``: duplicates, missing slots,
runs left running; ``overlaps``: forbid overlaps, bodies after their end, unjustified skips;
``leadership``: stale terms, terms held twice, leader gaps; ``recovery``: time to recover after
each fault; ``attempts``: lost runs' excuses, outcomes without a body, retries and early starts;
``intent``: what the operator asked for; ``schedule``: misfires and schedule edits;
``commit_order``: stale writes in the database's own order); this module holds the kinds, the
report and ``check``, which runs them all. No Django here.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from chaos.record import (
    LOST,
    SCHEDULE_TRIGGER,
    SKIPPED,
    CheckConfig,
    History,
    Index,
    Violation,
)
from chaos.rules import attempts, intent
from chaos.rules.attempts import (
    EARLY_RETRY,
    EARLY_START,
    PHANTOM_OUTCOME,
    TOO_MANY_ATTEMPTS,
    UNEXCUSED_LOST,
)
from chaos.rules.commit_order import STALE_COMMIT, stale_commits
from chaos.rules.fenced import STALE_FENCED_WRITE, fenced_writes
from chaos.rules.flow import (
    FLOW_BODY_OVERLAP,
    FLOW_NO_PERMIT,
    FLOW_OVER_LIMIT,
    FLOW_OVER_RATE,
    flow,
)
from chaos.rules.intent import FIRED_AFTER_DELETE, FIRED_WHILE_PAUSED, REQUEST_NOT_RUN
from chaos.rules.leadership import (
    LEADER_GAP,
    STALE_TERM_WRITE,
    TERM_HELD_TWICE,
    leader_gaps,
    stale_writes,
    terms_held_twice,
)
from chaos.rules.overlaps import (
    CUT_BODY_OVERLAP,
    FORBID_OVERLAP,
    FROZEN_AT_START,
    FROZEN_BODY_OVERLAP,
    LOST_WHILE_RUNNING,
    START_AFTER_LOST,
    UNJUSTIFIED_SKIP,
    forbid_overlaps,
    lost_while_running,
    starts_after_end,
    unjustified_skips,
)
from chaos.rules.recovery import SLOW_RECOVERY, recovery
from chaos.rules.runs import (
    DUPLICATE_EXECUTION,
    MISSING_SLOT,
    STUCK_RUNNING,
    duplicates,
    slots,
    stuck,
)
from chaos.rules.schedule import (
    MISFIRE_POLICY,
    SCHEDULE_EDIT,
    edits_followed,
    misfires,
    superseded,
)

API_ANOMALY = "api_anomaly"  # an operator action answered unexpectedly (5xx, a lost update)
NOTE_KINDS = (
    FROZEN_BODY_OVERLAP,
    CUT_BODY_OVERLAP,
    LOST_WHILE_RUNNING,
    FROZEN_AT_START,
    FLOW_BODY_OVERLAP,
)

VIOLATION_KINDS = (
    DUPLICATE_EXECUTION,
    MISSING_SLOT,
    FORBID_OVERLAP,
    START_AFTER_LOST,
    STUCK_RUNNING,
    STALE_TERM_WRITE,
    TERM_HELD_TWICE,
    LEADER_GAP,
    UNJUSTIFIED_SKIP,
    SLOW_RECOVERY,
    API_ANOMALY,
    UNEXCUSED_LOST,
    PHANTOM_OUTCOME,
    TOO_MANY_ATTEMPTS,
    EARLY_RETRY,
    EARLY_START,
    FIRED_WHILE_PAUSED,
    FIRED_AFTER_DELETE,
    REQUEST_NOT_RUN,
    MISFIRE_POLICY,
    STALE_COMMIT,
    SCHEDULE_EDIT,
    STALE_FENCED_WRITE,
    FLOW_OVER_LIMIT,
    FLOW_OVER_RATE,
    FLOW_NO_PERMIT,
)

# Fault kinds that make leadership impossible for a while (the coordination store or the database
# is gone): a leader gap overlapping one of them is excused for its length plus the recovery time.


# --- the report --------------------------------------------------------------------------------------


@dataclass
class Report:
    violations: list[Violation]
    notes: list[Violation]
    slots_checked: int
    executions: int
    runs: int  # bodies started (side-effect starts)
    indeterminate: int  # slots whose last attempt is lost: the body may or may not have run
    statuses: dict[str, int]
    faults_by_kind: dict[str, int]
    terms: int
    max_leader_gap_s: float
    window_s: float
    # Why slots in the window were not run: "skipped: <reason>" / "lost: <reason>" -> count.
    not_run: dict[str, int] = field(default_factory=dict)
    # Body start - slot of the scheduled first attempts in the window: p50, p99, max (ms).
    lag_ms: dict[str, float] = field(default_factory=dict)
    # Fault kind -> how the cluster recovered (recovery.KindRecovery as a dict).
    recovery: dict[str, dict[str, Any]] = field(default_factory=dict)
    shown_per_kind: int = 8
    # Committed transactions read from the database's own log (0: the database keeps none).
    commits_checked: int = 0
    # The fenced jobs' writes (rules.fenced.FencedStats as a dict).
    fenced: dict[str, int] = field(default_factory=dict)
    # Flow control: the most runs at once and per window seen against each limit
    # (rules.flow.FlowStats as a dict).
    flow: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_kind(self) -> dict[str, list[Violation]]:
        grouped: dict[str, list[Violation]] = {}
        for violation in self.violations:
            grouped.setdefault(violation.kind, []).append(violation)
        return grouped

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["violations_by_kind"] = {k: len(v) for k, v in self.by_kind().items()}
        data["notes_by_kind"] = dict(Counter(n.kind for n in self.notes))
        return data

    def render(self) -> str:
        lines = [
            f"window: {self.window_s:.1f} s; slots checked: {self.slots_checked}; executions: "
            f"{self.executions}; bodies started: {self.runs}; indeterminate (lost): "
            f"{self.indeterminate}",
            "statuses: " + _counts(self.statuses),
            f"leadership terms: {self.terms}; longest leader gap: {self.max_leader_gap_s:.2f} s; "
            + (
                f"commits checked in commit order: {self.commits_checked}"
                if self.commits_checked
                else "no commit log (stale writes judged by their timestamps)"
            ),
            "start lag (body start - slot): "
            + (", ".join(f"{k} {v:.0f} ms" for k, v in self.lag_ms.items()) or "no runs"),
            "faults: " + (_counts(self.faults_by_kind) or "none"),
        ]
        if self.fenced.get("writes"):
            f = self.fenced
            lines.append(
                f"fenced writes: {f['writes']} ({f['refused']} refused, {f['errors']} failed to "
                f"reach the database); bodies frozen or cut off mid-run that wrote after a newer run: "
                f"{f['frozen']}, refused {f['frozen_refused']} (still_owner() said true in "
                f"{f['frozen_still_owner']})"
            )
        if self.flow.get("judged_on"):
            at_once = ", ".join(
                f"{key} {most}/{limit}" for key, (most, limit) in self.flow["at_once"].items()
            )
            lines.append(
                f"flow control, most running at once / limit ({self.flow['judged_on']}): {at_once}"
            )
        if self.flow.get("in_window"):
            windows = ", ".join(
                f"{key} {most}/{limit}" for key, (most, limit) in self.flow["in_window"].items()
            )
            lines.append(
                f"flow control, most released in one rate window / limit "
                f"({self.flow['permits']} permits): {windows}"
            )
        if self.recovery:
            lines.append(
                "recovery by fault kind (longest): leader gap / takeover / job gap (bound)"
            )
            for kind, entry in self.recovery.items():
                takeover = entry["longest_takeover_s"]
                lines.append(
                    f"  {kind:<22} x{entry['faults']:<3} {entry['longest_leader_gap_s']:6.2f} s"
                    f" / {'-' if takeover is None else f'{takeover:.2f} s':>7}"
                    f" / {entry['longest_job_gap_s']:6.2f} s ({entry['bound_s']:.1f} s + interval)"
                )
        if self.not_run:
            lines.append("not run, with their reasons:")
            lines += [f"  {n:5d}  {reason}" for reason, n in sorted(self.not_run.items())]
        if self.notes:
            lines.append(f"notes (not violations): {len(self.notes)}")
            lines += self._grouped(self.notes, NOTE_KINDS)
        grouped = self.by_kind()
        if not grouped:
            lines.append("violations: none")
            return "\n".join(lines)
        kinds = Counter(v.kind for v in self.violations)
        lines.append(f"violations: {len(self.violations)} ({_counts(kinds)})")
        lines += self._grouped(self.violations, VIOLATION_KINDS)
        return "\n".join(lines)

    def _grouped(self, entries: list[Violation], order: Iterable[str]) -> list[str]:
        grouped: dict[str, list[Violation]] = defaultdict(list)
        for entry in entries:
            grouped[entry.kind].append(entry)
        lines = []
        for kind in order:
            found = grouped.get(kind, [])
            if not found:
                continue
            lines.append(f"  {kind}: {len(found)}")
            for entry in found[: self.shown_per_kind]:
                lines.append(f"    - {entry.message}")
                lines.append(f"      evidence: {_short(entry.evidence)}")
            if len(found) > self.shown_per_kind:
                lines.append(f"    ... {len(found) - self.shown_per_kind} more")
        return lines


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _short(evidence: Mapping[str, Any], limit: int = 600) -> str:
    text = ", ".join(f"{k}={_fmt(v)}" for k, v in evidence.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list | tuple):
        return "[" + "; ".join(_fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


# --- the checker -------------------------------------------------------------------------------------


def partition_views(history: History) -> dict[int, History]:
    """``history`` as each scheduling partition's leaders saw it: its terms, the claims of them,
    its jobs' runs and the commits on its fence (partition 0 always present)."""
    found = {0} | {t.partition for t in history.terms} | {c.partition for c in history.commits}
    if found == {0}:
        return {0: history}
    return {
        p: replace(
            history,
            terms=[t for t in history.terms if t.partition == p],
            term_claims=[c for c in history.term_claims if c.partition == p],
            executions=[e for e in history.executions if e.partition == p],
            commits=[c for c in history.commits if c.partition == p],
        )
        for p in sorted(found)
    }


def check(history: History, config: CheckConfig | None = None) -> Report:
    """Every violation of the guarantees in ``history``, by kind, with evidence."""
    config = config or CheckConfig()
    index = Index(history)
    violations: list[Violation] = []
    violations += duplicates(history, index)
    slots_checked, indeterminate, missing = slots(history, index, config)
    violations += missing
    overlaps, notes = forbid_overlaps(
        history,
        index,
        dead_after_s=config.dead_after_s,
        control_limit_s=config.db_control_limit_s,
    )
    violations += overlaps
    notes += lost_while_running(history, index)
    late_starts = starts_after_end(history, index)
    violations += [v for v in late_starts if v.kind == START_AFTER_LOST]
    notes += [v for v in late_starts if v.kind == FROZEN_AT_START]
    violations += stuck(history, config)
    # Leadership is judged per scheduling partition: each has its own terms and fence.
    parts = partition_views(history)
    max_gap = 0.0
    for part in parts.values():
        violations += stale_writes(part)
        violations += terms_held_twice(part)
        gaps, gap = leader_gaps(part, config)
        violations += gaps
        max_gap = max(max_gap, gap)
        violations += stale_commits(part)
    violations += unjustified_skips(history, index, config)
    # Takeovers are the cluster leader's (partition 0's); job gaps are every job's.
    recovered, slow = recovery(replace(history, terms=parts[0].terms), index, config)
    violations += slow
    violations += attempts.unexcused_lost(history, config)
    violations += attempts.phantom_outcomes(history, index)
    violations += attempts.attempts(history, index, config)
    violations += attempts.early_starts(history, index, config)
    violations += intent.fired_while_paused(history, config)
    violations += intent.fired_after_delete(history, config)
    violations += intent.requests_not_run(history, index, config)
    violations += misfires(history, config)
    violations += superseded(history, index, config)
    violations += edits_followed(history, index)
    stale_fenced, fenced_stats = fenced_writes(history, control_limit_s=config.db_control_limit_s)
    violations += stale_fenced
    flow_found, flow_notes, flow_stats = flow(history, index)
    violations += flow_found
    notes += flow_notes
    violations += [
        Violation(API_ANOMALY, f"{a.action}: {a.detail}", {"at": a.at})
        for a in history.api_anomalies
    ]
    return Report(
        violations=violations,
        notes=notes,
        slots_checked=slots_checked,
        executions=len(history.executions),
        runs=len(index.starts),
        indeterminate=indeterminate,
        statuses=dict(Counter(e.status for e in history.executions)),
        faults_by_kind=dict(Counter(f.kind for f in history.faults)),
        terms=len(history.terms),
        max_leader_gap_s=max_gap,
        window_s=max(0.0, history.window_end - history.window_start),
        lag_ms=_lag(history, index),
        not_run=_not_run(history),
        recovery={kind: asdict(entry) for kind, entry in sorted(recovered.items())},
        shown_per_kind=config.shown_per_kind,
        commits_checked=len(history.commits),
        fenced=asdict(fenced_stats),
        flow=asdict(flow_stats),
    )


NODE_NAME_RE = re.compile(r"\bnode \S+")


def _not_run(history: History) -> dict[str, int]:
    """Skipped and lost rows of the window by reason (node names folded, so reasons group)."""
    return dict(
        Counter(
            f"{e.status}: " + NODE_NAME_RE.sub("node *", e.reason or "(no reason)")
            for e in history.executions
            if e.status in (SKIPPED, LOST)
            and history.window_start <= e.scheduled_for <= history.window_end
        )
    )


def _lag(history: History, index: Index) -> dict[str, float]:
    """How late bodies started after their slot (not a guarantee: a symptom worth printing)."""
    lags = sorted(
        (index.starts[e.id][0].at - e.scheduled_for) * 1000
        for e in history.executions
        if e.trigger == SCHEDULE_TRIGGER
        and e.attempt == 1
        and e.id in index.starts
        and history.window_start <= e.scheduled_for <= history.window_end
    )
    if not lags:
        return {}

    def pct(p: float) -> float:
        return lags[min(len(lags) - 1, math.ceil(p / 100 * len(lags)) - 1)]

    return {"p50": pct(50), "p99": pct(99), "max": lags[-1]}
