"""The execution state machine: every edge allowed, every other edge refused, conditional writes."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.executions import transition
from jobs.models import Job, JobExecution
from jobs.states import (
    ERR_ILLEGAL_TRANSITION,
    INITIAL_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    ExecutionStatus,
    IllegalTransition,
    check_transition,
)

S = ExecutionStatus
LEGAL = {
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.CANCELLED),
    (S.PENDING, S.SKIPPED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.TIMED_OUT),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.LOST),
    (S.RUNNING, S.PENDING),  # handed back before its body started
    (S.RETRY_SCHEDULED, S.PENDING),
    (S.RETRY_SCHEDULED, S.CANCELLED),
}
ALL_PAIRS = list(itertools.product(list(S), repeat=2))


def test_table_matches_the_design():
    assert {(a, b) for a, nexts in TRANSITIONS.items() for b in nexts} == LEGAL
    assert TERMINAL_STATES == {S.SUCCEEDED, S.FAILED, S.TIMED_OUT, S.CANCELLED, S.LOST, S.SKIPPED}
    assert INITIAL_STATES == {S.PENDING, S.RETRY_SCHEDULED, S.SKIPPED}


@pytest.mark.parametrize(("source", "target"), ALL_PAIRS)
def test_check_transition(source, target):
    if (source, target) in LEGAL:
        check_transition(source, target)
    else:
        with pytest.raises(IllegalTransition) as info:
            check_transition(source, target)
        assert str(info.value) == ERR_ILLEGAL_TRANSITION.format(source=source, target=target)


def test_unknown_status_raises():
    with pytest.raises(ValueError, match="unknown execution status"):
        check_transition("pending", "exploded")


@pytest.fixture
def job(db):
    return Job.objects.create(name="j", task="noop", schedule_type="interval", interval_seconds=60)


def make_execution(job, status=S.PENDING, token=None, attempt=1):
    now = timezone.now()
    return JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, status=status, claim_token=token, attempt=attempt
    )


@pytest.mark.parametrize(("source", "target"), sorted(LEGAL))
def test_every_legal_transition_is_written(job, source, target):
    execution = make_execution(job, status=source, token="tok")
    assert transition(execution.pk, source=source, target=target, claim_token="tok")
    execution.refresh_from_db()
    assert execution.status == target


@pytest.mark.parametrize(("source", "target"), [p for p in ALL_PAIRS if p not in LEGAL])
def test_illegal_transition_raises_and_writes_nothing(job, source, target):
    execution = make_execution(job, status=source)
    with pytest.raises(IllegalTransition):
        transition(execution.pk, source=source, target=target)
    execution.refresh_from_db()
    assert execution.status == source


def test_stale_claim_token_changes_nothing(job):
    execution = make_execution(job, status=S.RUNNING, token="new-owner")
    assert not transition(
        execution.pk,
        source=S.RUNNING,
        target=S.SUCCEEDED,
        claim_token="old-owner",
        finished_at=timezone.now(),
    )
    execution.refresh_from_db()
    assert execution.status == S.RUNNING
    assert execution.finished_at is None


def test_writer_that_lost_the_race_changes_nothing(job):
    execution = make_execution(job, status=S.RUNNING, token="t")
    assert transition(execution.pk, source=S.RUNNING, target=S.LOST, claim_token="t")
    # The worker finishing late still believes the run is RUNNING: its write must not land.
    assert not transition(execution.pk, source=S.RUNNING, target=S.SUCCEEDED, claim_token="t")
    execution.refresh_from_db()
    assert execution.status == S.LOST


def test_unclaimed_condition(job):
    execution = make_execution(job, status=S.PENDING, token=None)
    assert transition(execution.pk, source=S.PENDING, target=S.SKIPPED, claim_token=None)
    claimed = make_execution(job, status=S.PENDING, token="x", attempt=2)
    assert not transition(claimed.pk, source=S.PENDING, target=S.SKIPPED, claim_token=None)


def test_extra_fields_written_with_the_transition(job):
    execution = make_execution(job, status=S.RUNNING, token="t")
    finished = timezone.now() + timedelta(seconds=1)
    assert transition(
        execution.pk,
        source=S.RUNNING,
        target=S.FAILED,
        claim_token="t",
        finished_at=finished,
        error="boom",
    )
    execution.refresh_from_db()
    assert (execution.status, execution.error, execution.finished_at) == (
        S.FAILED,
        "boom",
        finished,
    )
