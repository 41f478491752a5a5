"""Admission rules (cluster/admission.py), table-driven: pure, no database, no clock."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.admission import (
    BUFFER_RECHECK_S,
    FORBID_SETTLE_S,
    LOCK_UNAVAILABLE_RETRY_S,
    REASON_FORBID,
    REASON_LOCK_WAIT,
    REASON_MISFIRE_STALE,
    REASON_SUPERSEDED,
    WAIT_POLL_S,
    Blocker,
    Facts,
    HandBack,
    Lock,
    Skip,
    Start,
    Wait,
    admit,
)
from jobs.models import ConcurrencyPolicy as P

DUE = 1_000.0
GRACE = 60
BASE = Facts(
    policy=P.FORBID,
    scheduled=True,
    now=DUE,
    due=DUE,
    due_instant=DUE,
    runnable_since=DUE - 1,  # created a little ahead of its instant
    grace_s=GRACE,
    claiming=True,
    lock=Lock.HELD,
)
# Running when this one fell due (the run with id 7), its body listed by its node since.
ACTIVE_BEFORE = Blocker(started_at=DUE - 0.5, certain=True, execution_id=7, listed_at=DUE + 0.1)
ACTIVE_AFTER = Blocker(started_at=DUE + 0.5, certain=True)  # a late run started after our instant
EXPIRING = Blocker(started_at=DUE - 0.5, certain=False)  # its node stopped renewing
SILENT = Blocker(started_at=DUE - 0.5, certain=False, silent=True)  # frozen, not yet declared dead


# A catch-up run of a run_all job (run_all_max 10) whose slot passed 100 s ago, paced to DUE.
CATCH_UP = {
    "catch_up": True,
    "misfire_policy": "run_all",
    "run_all_max": 10,
    "due_instant": DUE - 100,
    "runnable_since": DUE,
}


def facts(**changes: object) -> Facts:
    return dataclasses.replace(BASE, **changes)


CASES = [
    # id, facts, decision
    ("allow-starts", facts(policy=P.ALLOW, lock=Lock.NOT_NEEDED), Start()),
    ("replace-starts", facts(policy=P.REPLACE, lock=Lock.NOT_NEEDED), Start()),
    ("forbid-free", facts(), Start()),
    (
        "stale-scheduled-fire",
        facts(now=DUE + GRACE + 1, runnable_since=DUE),
        Skip(REASON_MISFIRE_STALE.format(grace=GRACE)),
    ),
    (
        "stale-rule-not-for-manual-runs",
        facts(scheduled=False, now=DUE + GRACE + 1, runnable_since=DUE),
        Start(),
    ),
    # The lock is ours because its holder went silent (frozen past the lock's TTL): wait until
    # the cluster declares it gone (its run ended lost) rather than run beside its body.
    ("forbid-lock-lapsed-from-a-silent-holder-waits", facts(blocker=SILENT), Wait(WAIT_POLL_S)),
    (
        "forbid-silent-holder-past-the-grace",
        facts(blocker=SILENT, scheduled=False, now=DUE + GRACE + 1),
        Skip(REASON_LOCK_WAIT.format(grace=GRACE)),
    ),
    # A live node's row still says running (its finisher behind): the lock says the body ended.
    ("forbid-lock-held-beside-a-live-row-starts", facts(blocker=ACTIVE_BEFORE), Start()),
    ("draining-hands-back", facts(claiming=False), HandBack()),
    (
        "draining-before-forbid-skip",
        facts(claiming=False, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE),
        HandBack(),
    ),
    (
        "lock-service-down",
        facts(lock=Lock.UNAVAILABLE),
        HandBack(LOCK_UNAVAILABLE_RETRY_S),
    ),
    (
        "forbid-active-at-instant-and-after-the-settle",
        facts(now=DUE + FORBID_SETTLE_S, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE, seen_blocker=7),
        Skip(REASON_FORBID),
    ),
    # Its node has not listed its body as running since this run's instant (a body that ended
    # while its lock's release and its outcome are late): no skip; waited for, up to the grace.
    (
        "forbid-same-blocker-not-listed-since-the-instant-waits",
        facts(
            now=DUE + FORBID_SETTLE_S,
            lock=Lock.TAKEN,
            blocker=dataclasses.replace(ACTIVE_BEFORE, listed_at=DUE - 0.1),
            seen_blocker=7,
        ),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-same-blocker-never-listed-waits",
        facts(
            now=DUE + FORBID_SETTLE_S,
            lock=Lock.TAKEN,
            blocker=dataclasses.replace(ACTIVE_BEFORE, listed_at=None),
            seen_blocker=7,
        ),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-same-blocker-never-listed-past-the-grace",
        facts(
            scheduled=False,  # a manual run: no misfire staleness first
            now=DUE + GRACE + 0.01,
            lock=Lock.TAKEN,
            blocker=dataclasses.replace(ACTIVE_BEFORE, listed_at=None),
            seen_blocker=7,
        ),
        Skip(REASON_LOCK_WAIT.format(grace=GRACE)),
    ),
    # A first look after the settle (a late claim): the lock may be a newer run's whose row was
    # not marked running yet when the blockers were read; look again before skipping.
    (
        "forbid-first-look-after-the-settle-looks-again",
        facts(now=DUE + FORBID_SETTLE_S, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-another-blocker-at-the-last-look-looks-again",
        facts(now=DUE + FORBID_SETTLE_S, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE, seen_blocker=8),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-lock-held-while-a-finished-run-is-not-recorded-yet",
        facts(now=DUE + FORBID_SETTLE_S, lock=Lock.HELD, blocker=ACTIVE_BEFORE),
        Start(),
    ),
    (
        "forbid-lock-held-but-an-older-fire-goes-first",
        facts(lock=Lock.HELD, older_waiting=True),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-active-at-instant-waits-for-its-record",
        facts(lock=Lock.TAKEN, blocker=ACTIVE_BEFORE),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-settle-ends-on-time",
        facts(now=DUE + FORBID_SETTLE_S - 0.05, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE),
        Wait(0.05),
    ),
    (
        "forbid-judged-only-at-instant",
        facts(now=DUE - 0.05, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE),
        Wait(0.05),  # looks again at the instant, not a whole poll later
    ),
    (
        "forbid-late-predecessor-waited-for",
        facts(now=DUE + 1, lock=Lock.TAKEN, blocker=ACTIVE_AFTER),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-expiring-node-waited-for",
        facts(now=DUE + 1, lock=Lock.TAKEN, blocker=EXPIRING),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-lock-held-by-one-about-to-start",
        facts(now=DUE + 0.3, lock=Lock.TAKEN),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-older-fire-first",
        facts(older_waiting=True),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-behind-an-older-fire-nobody-holds-gives-its-claim-back",
        facts(lock=Lock.NOT_TRIED, older_waiting=True, older_unclaimed=True),
        HandBack(),
    ),
    (
        "forbid-behind-an-unclaimed-older-fire-before-its-own-instant",
        facts(now=DUE - 0.5, lock=Lock.NOT_TRIED, older_waiting=True, older_unclaimed=True),
        HandBack(),
    ),
    (
        "forbid-behind-an-active-run-and-an-unclaimed-older-fire-gives-its-claim-back",
        facts(
            now=DUE + FORBID_SETTLE_S,
            lock=Lock.NOT_TRIED,
            blocker=ACTIVE_BEFORE,
            older_waiting=True,
            older_unclaimed=True,
        ),
        HandBack(),
    ),
    (
        # The lock was not asked for (the older fire goes first): the row alone does not show the
        # blocker's body is still on (its outcome may be unwritten), so no skip on it.
        "forbid-never-skips-on-a-row-without-asking-the-lock",
        facts(
            now=DUE + FORBID_SETTLE_S,
            lock=Lock.NOT_TRIED,
            blocker=ACTIVE_BEFORE,
            older_waiting=True,
        ),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-lock-not-tried-behind-an-older-fire",
        facts(lock=Lock.NOT_TRIED, older_waiting=True),
        Wait(WAIT_POLL_S),
    ),
    (
        "forbid-gives-up-at-grace",
        facts(now=DUE + GRACE + 0.5, runnable_since=DUE, scheduled=False, lock=Lock.TAKEN),
        Skip(REASON_LOCK_WAIT.format(grace=GRACE)),
    ),
    (
        "forbid-grace-counts-from-late-creation",
        facts(now=DUE + GRACE + 0.5, runnable_since=DUE + 30, scheduled=False, lock=Lock.TAKEN),
        Wait(WAIT_POLL_S),
    ),
    # A fire overtaken by later fires of its job already due has misfired, whatever its grace:
    # the policy keeps the newest (run_once, skip) or the newest run_all_max (run_all).
    (
        "run-once-fire-overtaken-by-a-due-one-is-superseded",
        facts(now=DUE + 1.2, older_waiting=True, newer_due=1),
        Skip(REASON_SUPERSEDED.format(policy="run_once")),
    ),
    (
        "skip-fire-overtaken-is-superseded",
        facts(now=DUE + 3, misfire_policy="skip", newer_due=2),
        Skip(REASON_SUPERSEDED.format(policy="skip")),
    ),
    (
        "superseded-before-the-lock-is-looked-at",
        facts(now=DUE + 3, lock=Lock.TAKEN, blocker=ACTIVE_BEFORE, newer_due=1),
        Skip(REASON_SUPERSEDED.format(policy="run_once")),
    ),
    (
        "the-newest-due-fire-runs",
        facts(now=DUE + 1.2, newer_due=0),
        Start(),
    ),
    (
        "run-all-keeps-its-bound",
        facts(now=DUE + 5, misfire_policy="run_all", run_all_max=3, newer_due=2),
        Start(),
    ),
    (
        "run-all-beyond-its-bound-is-superseded",
        facts(now=DUE + 5, misfire_policy="run_all", run_all_max=3, newer_due=3),
        Skip(REASON_SUPERSEDED.format(policy="run_all")),
    ),
    (
        "manual-runs-are-never-superseded",
        facts(scheduled=False, now=DUE + 3, newer_due=2),
        Start(),
    ),
    (
        "allow-fire-overtaken-is-superseded-too",
        facts(policy=P.ALLOW, lock=Lock.NOT_NEEDED, now=DUE + 2, newer_due=1),
        Skip(REASON_SUPERSEDED.format(policy="run_once")),
    ),
    (
        "stale-wins-over-superseded",
        facts(now=DUE + GRACE + 1, runnable_since=DUE, newer_due=5),
        Skip(REASON_MISFIRE_STALE.format(grace=GRACE)),
    ),
    # A catch-up run: its slot 100 s past, released on the budget at DUE (its paced run_after).
    (
        "catch-up-is-not-superseded-by-the-on-time-fires-due-while-it-waited",
        facts(**CATCH_UP, newer_due=100, newer_catch_up_due=3),
        Start(),
    ),
    (
        "catch-up-beyond-its-bound-among-catch-up-fires-is-superseded",
        facts(**CATCH_UP, newer_due=100, newer_catch_up_due=10),
        Skip(REASON_SUPERSEDED.format(policy="run_all")),
    ),
    (
        "catch-up-is-stale-from-its-paced-instant-not-its-slot",
        facts(**{**CATCH_UP, "now": DUE + GRACE - 0.5}, newer_due=100),
        Start(),
    ),
    (
        "catch-up-not-started-within-the-grace-of-its-paced-instant-is-stale",
        facts(**{**CATCH_UP, "now": DUE + GRACE + 0.5}),
        Skip(REASON_MISFIRE_STALE.format(grace=GRACE)),
    ),
    (
        "catch-up-waits-for-an-on-time-run-of-its-job-that-took-the-lock",
        facts(**CATCH_UP, lock=Lock.TAKEN, blocker=ACTIVE_AFTER, newer_due=100),
        Wait(WAIT_POLL_S),
    ),
    (
        "an-on-time-fire-is-superseded-by-later-fires-as-before",
        facts(**{**CATCH_UP, "catch_up": False}, newer_due=10, newer_catch_up_due=0),
        Skip(REASON_SUPERSEDED.format(policy="run_all")),
    ),
    (
        "buffer-one-free",
        facts(policy=P.BUFFER_ONE, lock=Lock.NOT_NEEDED),
        Start(),
    ),
    (
        "buffer-one-waits-its-turn",
        facts(policy=P.BUFFER_ONE, lock=Lock.NOT_NEEDED, blocker=ACTIVE_BEFORE),
        HandBack(BUFFER_RECHECK_S),
    ),
    (
        "buffer-one-waits-for-an-expiring-node-too",
        facts(policy=P.BUFFER_ONE, lock=Lock.NOT_NEEDED, blocker=EXPIRING),
        HandBack(BUFFER_RECHECK_S),
    ),
]


@pytest.mark.parametrize(("given", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_admission(given: Facts, expected: object) -> None:
    decision = admit(given)
    if isinstance(expected, Wait):
        assert isinstance(decision, Wait)
        assert decision.seconds == pytest.approx(expected.seconds)
    else:
        assert decision == expected
