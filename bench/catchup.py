"""Catch-up after a whole-cluster outage (docs/benchmarks.md): 200 interval jobs every second with
the ``run_all`` policy (``run_all_max`` 10, a 2 s misfire grace) on 3 ``runnode`` nodes; every node
is stopped (SIGTERM) for 60 s and started again. The backlog (200 x 10 missed slots) drains on the
catch-up budget (``runnode --catch-up-per-s``) while the on-time fires go on. A measurement, not a
test.

    python -m bench.catchup                          # budget 50/s, SQLite or BENCH_DATABASE_URL
    python -m bench.catchup --budget 50 0            # then without a budget, to compare
    BENCH_DATABASE_URL=mysql://root@127.0.0.1:3306/sched_bench python -m bench.catchup

It prints, per budget:

- released: the most catch-up bodies started in any one second (a sliding 1 s window over their
  starts), against the budget; and the most paced instants (``run_after``) in any second;
- drain: from the restart to the first catch-up body, and from the first to the last;
- on-time fires during the drain (slots from the first catch-up body + 1 s to the last): how many
  started of how many were due, how many were skipped and why, and their lag (body start - slot)
  p50 / p99 / max;
- the catch-up runs by outcome (none should be skipped).

Every process is started here and stopped here by PID (the nodes, a private Redis); traffic stays
on loopback; every wait is bounded (about two and a half minutes a budget).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.run import Environment, Nodes, lag_summary, read_records, wait_for_leader

JOBS = 200
RUN_ALL_MAX = 10
GRACE_S = 2
WARMUP_S = 10.0
OUTAGE_S = 60.0
# After the backlog is gone, the on-time fires go on this long before the nodes stop.
AFTER_S = 3.0
# The drain may take this much longer than the budget says before the run gives up waiting.
DRAIN_SLACK_S = 30.0
DEFAULT_DATABASE_URL = "sqlite:///{workdir}/catchup.sqlite3"


def busiest_second(instants: list[float]) -> int:
    """The most of ``instants`` in any window [t, t + 1 s)."""
    ordered = sorted(instants)
    return max(
        (bisect.bisect_left(ordered, at + 1.0) - k for k, at in enumerate(ordered)), default=0
    )


def create_jobs(path: Path) -> None:
    from jobs import services

    items = [
        {
            "name": f"catchup-{index:04d}",
            "task": "bench.record",
            "kwargs": {"path": str(path)},
            "schedule_type": "interval",
            "interval_seconds": 1,
            "misfire_policy": "run_all",
            "run_all_max": RUN_ALL_MAX,
            "misfire_grace_seconds": GRACE_S,
        }
        for index in range(JOBS)
    ]
    for start in range(0, JOBS, services.MAX_BATCH_JOBS):
        services.jobs_create_batch(
            items=items[start : start + services.MAX_BATCH_JOBS], by=services.SYSTEM
        )


def pending_catch_up() -> int:
    from jobs.models import JobExecution
    from jobs.states import ExecutionStatus

    return JobExecution.objects.filter(status=ExecutionStatus.PENDING, catch_up=True).count()


def run(env: Environment, *, budget: float, outage_s: float = OUTAGE_S) -> dict[str, Any]:
    from jobs.models import JobExecution
    from jobs.states import ExecutionStatus

    prefix = env.reset()
    path = env.workdir / f"{prefix}-catchup.txt"
    create_jobs(path)
    args = ("--catch-up-per-s", f"{budget:g}")
    nodes = Nodes(env, prefix, args=args)
    try:
        wait_for_leader()
        time.sleep(WARMUP_S)
    finally:
        nodes.stop()
    stopped_at = time.time()
    print(f"  every node stopped; down for {outage_s:.0f} s ...", flush=True)
    time.sleep(outage_s)
    restarted_at = time.time()
    nodes = Nodes(env, prefix, args=args)
    try:
        wait_for_leader()
        # The backlog is written by the new leader's first tick; then wait for it to drain.
        expected_s = JOBS * RUN_ALL_MAX / budget if budget > 0 else 0.0
        deadline = time.monotonic() + expected_s + DRAIN_SLACK_S
        time.sleep(2.0)
        while time.monotonic() < deadline and pending_catch_up():
            time.sleep(0.5)
        time.sleep(AFTER_S)
    finally:
        nodes.stop()
        problems = nodes.problems()

    records = read_records(path)
    catch_up_rows = list(
        JobExecution.objects.filter(catch_up=True).values_list(
            "job__name", "scheduled_for", "status", "reason", "run_after"
        )
    )
    if catch_up_rows:
        keys = {(name, round(slot.timestamp(), 3)) for name, slot, *_ in catch_up_rows}
        released = [r.timestamp() for *_, r in catch_up_rows]
    else:
        # No budget: the missed slots' runs are ordinary late fires (not marked): those of the
        # slots the outage covered, written after the restart.
        late = JobExecution.objects.filter(
            scheduled_for__gte=_at(stopped_at + 2), scheduled_for__lt=_at(restarted_at)
        ).exclude(status=ExecutionStatus.SKIPPED, reason__startswith="misfire: beyond")
        keys = {
            (name, round(slot.timestamp(), 3))
            for name, slot in late.values_list("job__name", "scheduled_for")
        }
        released = []
    catch_up_starts = sorted(
        started for job, slot, attempt, started, _ in records if (job, round(slot, 3)) in keys
    )
    first = catch_up_starts[0] if catch_up_starts else restarted_at
    last = catch_up_starts[-1] if catch_up_starts else restarted_at
    window = (math.ceil(first) + 1, math.floor(last))
    on_time = [
        (started - slot) * 1000
        for job, slot, attempt, started, _ in records
        if (job, round(slot, 3)) not in keys and window[0] <= slot <= window[1]
    ]
    due = JOBS * max(0, window[1] - window[0] + 1)
    skipped = Counter(
        JobExecution.objects.filter(
            status=ExecutionStatus.SKIPPED,
            catch_up=False,
            scheduled_for__gte=_at(window[0]),
            scheduled_for__lte=_at(window[1]),
        ).values_list("reason", flat=True)
    )
    outcomes = Counter((status, reason) for _, _, status, reason, _ in catch_up_rows)
    return {
        "budget_per_s": budget,
        "jobs": JOBS,
        "run_all_max": RUN_ALL_MAX,
        "outage_s": round(restarted_at - stopped_at, 1),
        "catch_up_runs": len(keys),
        "catch_up_started": len(catch_up_starts),
        "catch_up_outcomes": {f"{s} {r}".strip(): n for (s, r), n in outcomes.items()},
        "released_max_per_1s_window": busiest_second(catch_up_starts),
        "paced_max_per_1s_window": busiest_second(released),
        "restart_to_first_catch_up_s": round(first - restarted_at, 2),
        "drain_s": round(last - first, 2),
        "on_time_during_drain": {
            "slots": [window[0], window[1]],
            "due": due,
            "started": len(on_time),
            "skipped": dict(skipped),
            "lag_ms": {k: round(v, 1) for k, v in lag_summary(on_time).items()},
        },
        "node_logs": problems,
    }


def _at(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, tz=UTC)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--budget",
        type=float,
        nargs="+",
        default=[50.0],
        help="catch-up budgets to run, one run each (runs a second; 0: none)",
    )
    parser.add_argument("--outage", type=float, default=OUTAGE_S, help="seconds every node is down")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--no-pin", action="store_true", help="leave the nodes unpinned")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sched-catchup-"))
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", DEFAULT_DATABASE_URL.format(workdir=workdir)
    )
    env = Environment(database_url, workdir, pin_cpus=not args.no_pin)
    results: dict[str, Any] = {"database": database_url.split("://")[0], "runs": []}
    try:
        for budget in args.budget:
            print(
                f"catch-up: {JOBS} jobs every second (run_all, run_all_max {RUN_ALL_MAX}), "
                f"3 nodes, budget {budget:g}/s ...",
                flush=True,
            )
            result = run(env, budget=budget, outage_s=args.outage)
            results["runs"].append(result)
            print(json.dumps(result, indent=2), flush=True)
    finally:
        env.close()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
