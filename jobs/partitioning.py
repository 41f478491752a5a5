"""Which scheduling partition fires a job.

The jobs are split into P partitions; each has a leader of its own (``cluster.partitions``), which
fires only the jobs of its partition. A job's partition is a stable function of its name, the same
on every process (a hash, not Python's salted ``hash()``), kept in ``Job.partition`` so the leader
finds its due jobs through an index. P lives in the database (``SchedulerSetting`` "partitions"),
not in each process's settings: processes that disagreed on it would fire a job twice or never.
It is 1 until an operator sets it (``manage.py partitions --set P``, with the cluster stopped).

A process reads P at most every ``COUNT_CACHE_S``; a job written meanwhile by a process that has
not seen a new P keeps a partition that is either still below P (it fires, from a partition that
is not its hash's: harmless) or not (partition 0's leader moves it: ``misplaced``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable

from django.db import transaction
from django.db.models import Count

from jobs.models import Job, SchedulerSetting

SETTING = "partitions"
MAX_PARTITIONS = 256
COUNT_CACHE_S = 5.0
# Rows rewritten per statement when P changes.
REWRITE_CHUNK = 5000
ERR_COUNT = "the partition count must be an integer from 1 to {limit}, got {value!r}"

_cached: tuple[float, int] | None = None


def of_name(name: str, count: int) -> int:
    """The partition of the job named ``name`` among ``count``. Not the spread's hash (the first
    bytes of SHA-256 of the name): a partition's jobs spread over the whole interval."""
    if count <= 1:
        return 0
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8, person=b"partition").digest()
    return int.from_bytes(digest, "big") % count


def count_problem(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PARTITIONS:
        return ERR_COUNT.format(limit=MAX_PARTITIONS, value=value)
    return None


def count(*, fresh: bool = False) -> int:
    """The cluster's partition count (1 when never set), read at most every COUNT_CACHE_S."""
    global _cached
    now = time.monotonic()
    if not fresh and _cached is not None and now - _cached[0] < COUNT_CACHE_S:
        return _cached[1]
    stored = SchedulerSetting.objects.filter(name=SETTING).values_list("value", flat=True).first()
    value = int(stored) if stored else 1
    _cached = (now, value)
    return value


def forget_count() -> None:
    """Read P again at the next ``count()`` (tests, and after ``set_count``)."""
    global _cached
    _cached = None


def assign(jobs: Iterable[Job]) -> None:
    """Set each (unsaved or renamed) job's partition from its name."""
    total = count()
    for job in jobs:
        job.partition = of_name(job.name, total)


def _rewrite(rows: list[tuple[int, str]], total: int) -> int:
    by_partition: dict[int, list[int]] = {}
    for pk, name in rows:
        by_partition.setdefault(of_name(name, total), []).append(pk)
    moved = 0
    for partition, ids in by_partition.items():
        moved += (
            Job.objects.filter(pk__in=ids).exclude(partition=partition).update(partition=partition)
        )
    return moved


def set_count(total: int) -> int:
    """Make ``total`` the partition count and move every job to its partition under it. Returns
    how many jobs moved. Run with the cluster stopped (``manage.py partitions`` checks): a node
    running with the old count would lead partitions that no longer exist."""
    problem = count_problem(total)
    if problem:
        raise ValueError(problem)
    moved = 0
    with transaction.atomic():
        SchedulerSetting.objects.update_or_create(name=SETTING, defaults={"value": total})
        last = 0
        while True:
            rows = list(
                Job.objects.filter(pk__gt=last)
                .order_by("pk")
                .values_list("pk", "name")[:REWRITE_CHUNK]
            )
            if not rows:
                break
            moved += _rewrite(rows, total)
            last = rows[-1][0]
    forget_count()
    return moved


def misplaced(total: int, *, limit: int = 1000) -> int:
    """Move jobs whose partition is not below ``total`` (written by a process that had not yet
    seen P lowered) to their partition. One index range read when there are none."""
    rows = list(
        Job.objects.filter(partition__gte=total).order_by("pk").values_list("pk", "name")[:limit]
    )
    return _rewrite(rows, total) if rows else 0


def sizes(total: int) -> dict[int, int]:
    """How many jobs each partition holds (the operator's view of the balance)."""
    found = dict(
        Job.objects.order_by()
        .values_list("partition")
        .annotate(n=Count("id"))
        .values_list("partition", "n")
    )
    return {p: found.get(p, 0) for p in range(max(total, max(found, default=0) + 1))}
