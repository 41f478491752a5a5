"""Job chains: a job names, in ``on_success``, ``on_failure`` and ``on_end``, jobs to run when one of
its runs ends for good (docs/jobs.md, "Chains").

This module holds the rules, not the writes: which outcome fires which list, when an outcome is
final, and what makes a set of definitions acceptable (every name is a job, no chain leads back to
where it started). The chained runs themselves are made by ``jobs.executions`` in the transaction
that writes the outcome; the definitions are checked by the services before they are written.

- **success** fires on ``succeeded``; **failure** on ``failed``, ``timed_out`` and ``lost``; **end**
  on any of those four. A run that was cancelled or skipped fires nothing: it did not run to an
  outcome of its own (an operator stopped it, a policy passed it over).
- An outcome that will be retried is not final: the chain fires once, on the last attempt's
  outcome.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from jobs.definition import CHAIN_FIELDS
from jobs.models import Job
from jobs.states import RETRYABLE_STATES, ExecutionStatus

S = ExecutionStatus

# Which lists an outcome fires, in the order their runs are made.
FIRED_BY: dict[str, tuple[str, ...]] = {
    S.SUCCEEDED: ("on_success", "on_end"),
    S.FAILED: ("on_failure", "on_end"),
    S.TIMED_OUT: ("on_failure", "on_end"),
    S.LOST: ("on_failure", "on_end"),
}

# The reason on the skipped row a chain leaves for a paused target (nothing is silent).
REASON_TARGET_DISABLED = "chain: target job disabled"

ERR_UNKNOWN_TARGET = "No job is named {name!r} (names are compared exactly)."
ERR_CYCLE = "Makes a cycle: {path}. A chain may not lead back to a job it started from."
ERR_SELF = "Names this job itself: a run cannot chain to its own job."
ERR_NOT_NAMES = "Expected a list of job names."
ERR_DUPLICATE = "{name!r} appears more than once."
ERR_TOO_MANY = "At most {limit} jobs."
ERR_RENAME_REFERENCED = (
    "Other jobs chain to this job by its name ({referrers}): remove it from their chains "
    "before renaming it."
)
ERR_DELETE_REFERENCED = (
    "Other jobs chain to this job ({referrers}): remove it from their chains before deleting it."
)


def is_final(*, status: str, attempt: int, max_retries: int) -> bool:
    """Whether ``status`` is the last word on its fire slot: no further attempt will be made
    (the same rule ``create_retry_if_allowed`` applies)."""
    return not (status in RETRYABLE_STATES and attempt <= max_retries)


def targets(job: Job, status: str) -> list[str]:
    """The names of the jobs an outcome ``status`` of ``job`` fires (each once, in order)."""
    names: list[str] = []
    for field in FIRED_BY.get(status, ()):
        for name in getattr(job, field) or ():
            if name not in names:
                names.append(name)
    return names


def fires(job: Job, *, status: str, attempt: int) -> bool:
    """Whether this outcome makes chained runs (no query: the job's own lists)."""
    return bool(targets(job, status)) and is_final(
        status=status, attempt=attempt, max_retries=job.max_retries
    )


# --- definitions --------------------------------------------------------------------------------


def edges(values: Mapping[str, object]) -> list[tuple[str, str]]:
    """(field, target) of a definition's chains, in the fields' order."""
    return [
        (field, name)
        for field in CHAIN_FIELDS
        for name in (values.get(field) or ())  # type: ignore[union-attr]
    ]


def find_cycle(graph: Mapping[str, Iterable[str]], start: str) -> list[str] | None:
    """A path from ``start`` back to itself (``[start, ..., start]``), or None. Depth first, a
    loop not recursion: a long chain cannot exhaust the stack."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


@dataclass(frozen=True)
class Problem:
    """One definition's chain refused: the job (by name), the field and the reason."""

    job: str
    field: str
    message: str


def check_definitions(
    proposed: Mapping[str, Mapping[str, object]],
    *,
    stored: Mapping[str, Mapping[str, object]],
    known: Collection[str],
) -> list[Problem]:
    """What is wrong with the chains of ``proposed`` (name -> cleaned values), applied over
    ``stored`` (the chains of the jobs already written, name -> values) when every job named in
    ``known`` exists.

    Each target must be a job; no chain may lead back to where it started. The stored graph has
    no cycle (every write was checked), so a new cycle passes through a proposed job: only those
    are walked from."""
    graph: dict[str, list[str]] = {
        name: [target for _, target in edges(values)] for name, values in stored.items()
    }
    for name, values in proposed.items():
        graph[name] = [target for _, target in edges(values)]
    problems: list[Problem] = []
    for name, values in proposed.items():
        bad_field = False
        for field, target in edges(values):
            if target not in known:
                problems.append(Problem(name, field, ERR_UNKNOWN_TARGET.format(name=target)))
                bad_field = True
        if bad_field:
            continue
        cycle = find_cycle(graph, name)
        if cycle is not None:
            # Reported on the field whose edge starts the cycle.
            field = next(f for f, target in edges(values) if target == cycle[1])
            problems.append(Problem(name, field, ERR_CYCLE.format(path=" → ".join(cycle))))
    return problems


def referrers(
    name: str, stored: Mapping[str, Mapping[str, object]], *, ignoring: Collection[str] = ()
) -> list[str]:
    """Who chains to ``name`` ("job (field)"), apart from the job itself and ``ignoring``."""
    return [
        f"{other} ({field})"
        for other, values in sorted(stored.items())
        if other != name and other not in ignoring
        for field, target in edges(values)
        if target == name
    ]


def stored_chains() -> dict[str, dict[str, list[str]]]:
    """The chains of every job that has one (name -> lists): the graph the checks walk. Read
    whole, as few jobs have chains; a job without any is left out by the query."""
    rows = Job.objects.exclude(on_success=[], on_failure=[], on_end=[]).values_list(
        "name", *CHAIN_FIELDS
    )
    return {name: dict(zip(CHAIN_FIELDS, lists, strict=True)) for name, *lists in rows}


def existing_names(names: Iterable[str]) -> set[str]:
    """Which of ``names`` are jobs, compared exactly (MariaDB's collation would match any case)."""
    wanted = set(names)
    if not wanted:
        return set()
    found = Job.objects.filter(name__in=wanted).values_list("name", flat=True)
    return {name for name in found if name in wanted}
