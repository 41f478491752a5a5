"""The claims' per-process job cache (jobs/executions/rows.py): jobs read by the row loader equal
the ORM's, an entry survives the leader's advance of the job's fire times, and an edit (a new
version) is read again."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services
from jobs.executions.rows import _JobCache
from jobs.models import Job

pytestmark = pytest.mark.django_db


def _job(name: str = "cached", **fields: object) -> Job:
    return services.job_create(
        data={
            "name": name,
            "task": "log",
            "schedule_type": "interval",
            "interval_seconds": 60,
            "kwargs": {"message": "héllo", "level": "warning"},
            "spread_seconds": 30,
            "timeout_seconds": 5,
            **fields,
        },
        by=services.SYSTEM,
    )


def _stamps(*jobs: Job) -> dict[int, tuple[object, object]]:
    return {
        pk: (version, updated)
        for pk, version, updated in Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list(
            "pk", "version", "created_at"
        )
    }


def test_a_job_read_by_the_cache_equals_the_orms_in_every_field() -> None:
    job = _job(retry_jitter=False, enabled=True)
    [cached] = _JobCache().current({job.pk}).values()
    orm = Job.objects.get(pk=job.pk)
    for field in Job._meta.concrete_fields:
        assert getattr(cached, field.attname) == getattr(orm, field.attname), field.name
        assert type(getattr(cached, field.attname)) is type(getattr(orm, field.attname)), field.name
    assert cached.kwargs == {"message": "héllo", "level": "warning"}
    assert cached._state.adding is False


def test_the_leaders_advance_of_fire_times_keeps_the_entry() -> None:
    job = _job()
    cache = _JobCache()
    first = cache.current({job.pk}, _stamps(job))[job.pk]
    job.next_fire_at = job.next_fire_at + timedelta(minutes=1)
    job.last_fire_at = timezone.now()
    services.jobs_advance(jobs=[job], now=timezone.now() + timedelta(seconds=1))
    stamps = _stamps(job)
    with CaptureQueriesContext(connection) as queries:
        again = cache.current({job.pk}, stamps)[job.pk]
    assert again is first
    assert queries.captured_queries == []


def test_an_edit_is_read_again() -> None:
    job = _job()
    cache = _JobCache()
    cache.current({job.pk}, _stamps(job))
    edited = services.job_update(
        job_id=job.pk,
        changes={"kwargs": {"message": "changed"}},
        expected_version=job.version,
        by=services.SYSTEM,
    )
    assert cache.current({job.pk}, _stamps(edited))[job.pk].kwargs == {"message": "changed"}
    paused, _ = services.job_set_enabled(job_id=job.pk, enabled=False, by=services.SYSTEM)
    assert cache.current({job.pk}, _stamps(paused))[job.pk].enabled is False


def test_a_job_given_the_id_of_a_cached_one_is_read_again() -> None:
    """Same id, same version, another job (a rolled-back transaction's id given again): the
    creation stamp tells them apart."""
    job = _job()
    cache = _JobCache()
    cache.current({job.pk}, _stamps(job))
    pk = job.pk
    Job.objects.filter(pk=pk).delete()
    other = _job("other", concurrency_policy="allow")
    Job.objects.filter(pk=other.pk).update(id=pk)
    reused = Job.objects.get(pk=pk)
    assert reused.version == job.version
    assert cache.current({pk}, _stamps(reused))[pk].name == "other"


def test_rows_loaded_for_some_fields_equal_the_orms_only_and_defer_the_rest() -> None:
    """executions.load_rows: the queryset's own order and limit, the named fields as the ORM reads
    them, the others deferred (read when used)."""
    from jobs.executions import load_rows

    for k in range(3):
        _job(f"only{k}", priority=k)
    names = ("id", "name", "priority", "next_fire_at", "enabled", "start_at")
    queryset = Job.objects.filter(name__startswith="only").order_by("-priority")
    loaded = load_rows(queryset, names, 2)
    orm = list(queryset.only(*names)[:2])
    assert [job.pk for job in loaded] == [job.pk for job in orm]
    for ours, theirs in zip(loaded, orm, strict=True):
        for name in names:
            assert getattr(ours, name) == getattr(theirs, name), name
            assert type(getattr(ours, name)) is type(getattr(theirs, name)), name
        assert ours.get_deferred_fields() == theirs.get_deferred_fields()
        assert ours._state.adding is False
        assert ours.kwargs == {"message": "héllo", "level": "warning"}  # deferred, then read


def test_empty_documents_are_read_as_new_objects_not_shared_ones() -> None:
    """A job's empty lists and objects are made per row (a shared one, changed by one run, would
    change every job's)."""
    first, second = _job("empty1", tags=[], args=[]), _job("empty2", tags=[], args=[])
    jobs = _JobCache().current({first.pk, second.pk})
    one, other = jobs[first.pk], jobs[second.pk]
    assert one.tags == [] and one.args == [] and one.tags is not other.tags
    assert one.args is not other.args and one.tags is not one.args


def test_claims_cycling_through_more_jobs_than_the_bound_still_find_a_share_cached() -> None:
    """Each node of a large cluster sees every job of its share once an interval, in no set
    order: a cache of a third of them serves about a third, where forgetting everything (or the
    oldest) whenever full would serve none."""
    import random

    jobs = [_job(f"cycled-{k}") for k in range(30)]
    stamps = _stamps(*jobs)
    cache = _JobCache(limit=10, rng=random.Random(7))
    order = random.Random(3)
    served = 0
    for cycle in range(4):
        order.shuffle(jobs)
        for job in jobs:
            with CaptureQueriesContext(connection) as queries:
                found = cache.current({job.pk}, {job.pk: stamps[job.pk]})
            assert found[job.pk].pk == job.pk
            assert len(cache) <= 10
            served += cycle > 0 and not queries.captured_queries
    assert served >= 20  # of 90 asked after the first cycle; about 30 expected


def test_a_batch_larger_than_the_bound_keeps_only_the_bound() -> None:
    import random

    jobs = [_job(f"batch-{k}") for k in range(5)]
    cache = _JobCache(limit=3, rng=random.Random(1))
    found = cache.current({j.pk for j in jobs}, _stamps(*jobs))
    assert set(found) == {j.pk for j in jobs}
    assert len(cache) == 3


def test_a_cache_of_size_zero_keeps_nothing_and_reads_every_time() -> None:
    job = _job()
    cache = _JobCache(limit=0)
    stamps = _stamps(job)
    cache.current({job.pk}, stamps)
    assert len(cache) == 0
    with CaptureQueriesContext(connection) as queries:
        assert cache.current({job.pk}, stamps)[job.pk].pk == job.pk
    assert len(queries.captured_queries) == 1


def test_set_job_cache_size_bounds_the_process_cache() -> None:
    from jobs.executions import rows

    before = rows._job_cache.limit
    try:
        rows.set_job_cache_size(2)
        jobs = [_job(f"process-{k}") for k in range(4)]
        rows._job_cache.current({j.pk for j in jobs}, _stamps(*jobs))
        assert len(rows._job_cache) <= 2
    finally:
        rows.set_job_cache_size(before)
