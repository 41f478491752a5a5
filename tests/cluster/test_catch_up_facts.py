"""What admission is told about catch-up runs (cluster/executor/facts.py), against real rows: a
catch-up run counts only the later catch-up fires of its job, and within a job the older due run
goes first, catch-up or not."""

from __future__ import annotations

import pytest

from cluster.executor import facts as gather
from jobs.models import JobExecution
from jobs.states import ExecutionStatus
from tests.cluster.leader_rows import SECOND, T0, add_execution, make_job, scheduled

pytestmark = pytest.mark.django_db

S = ExecutionStatus
NOW = T0 + 100 * SECOND


def backlog():
    """A 1 s run_all job after an outage: catch-up runs for slots 0-2 paced from NOW, and the
    on-time fires of slots 90-99 (written since, some run, some waiting)."""
    job = make_job(interval_seconds=1, misfire_policy="run_all", run_all_max=3)
    catch_up = [
        add_execution(
            job,
            slot=T0 + k * SECOND,
            status=S.PENDING,
            catch_up=True,
            run_after=NOW + k * 0.02 * SECOND,
        )
        for k in range(3)
    ]
    on_time = [
        add_execution(job, slot=T0 + k * SECOND, status=S.SUCCEEDED) for k in range(90, 99)
    ] + [add_execution(job, slot=T0 + 99 * SECOND, status=S.PENDING)]
    return catch_up, on_time


def test_a_catch_up_run_is_told_only_of_the_later_catch_up_fires_of_its_job():
    catch_up, on_time = backlog()

    newer = gather.newer_due([scheduled(catch_up[0]), scheduled(on_time[-1])], now=NOW)

    # 2 later catch-up fires and 10 on-time ones; the newest on-time fire has none after it.
    assert newer == {catch_up[0].pk: (12, 2)}


def test_a_catch_up_run_whose_instant_has_come_goes_before_its_jobs_on_time_fire():
    catch_up, on_time = backlog()

    # Only the first is due by its paced instant: the on-time fire waits for it, not for the rest.
    first = gather.older_waiting([scheduled(on_time[-1])], now=catch_up[0].run_after)
    assert first == {on_time[-1].pk: True}
    JobExecution.objects.filter(pk=catch_up[0].pk).update(status=S.SUCCEEDED)
    assert gather.older_waiting([scheduled(on_time[-1])], now=catch_up[0].run_after) == {}
    # Catch-up runs keep their order.
    later = NOW + SECOND
    assert gather.older_waiting([scheduled(catch_up[2])], now=later) == {catch_up[2].pk: True}
