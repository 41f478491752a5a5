"""The benchmark PEER: a Celery app scheduled by celery-redbeat (docs/benchmarks.md).

Configured the way a user would: broker and redbeat on the same Redis, N interval entries in
``beat_schedule`` (``"schedule": 1.0`` = every second, Celery's default non-relative interval), the
scheduler started with ``celery beat -S <RedBeatScheduler subclass>`` on every node, redbeat's Redis
lock deciding which beat actually schedules.

Environment (set by ``run_peer.py``):
  PEER_REDIS_URL          broker + redbeat Redis URL (required)
  PEER_RECORD_FILE        file every execution appends one line to (required for the worker)
  PEER_JOBS               number of interval entries (default 200)
  PEER_INTERVAL           seconds between fires of one entry (default 1.0)
  PEER_NAMESPACE          per-run namespace: redbeat key prefix and queue name, so runs on the same
                          Redis never see each other's keys (default "peer")
  PEER_LOCK_TIMEOUT       redbeat_lock_timeout in seconds; unset = redbeat's default, which is
                          5 x beat_max_loop_interval = 5 x 300 s = 1500 s
  PEER_MAX_LOOP_INTERVAL  beat_max_loop_interval in seconds; unset = Celery/redbeat default (300 s).
                          NB: redbeat's standby beats retry the lock every max_interval seconds
                          (redis-py Lock(sleep=max_interval)), so with the default a standby checks
                          the lock only every 300 s whatever the lock timeout is.
  PEER_BEAT_INFO_DIR      if set, every beat writes "<pid> <lock token>" to beat-<pid>.lock there
                          once it holds the lock (bookkeeping so the runner can find the leader)

What "due" means for the peer (the ``slot_ts`` recorded with every execution)
---------------------------------------------------------------------------
Celery beat never passes a fire time to the task, so ``StampingRedBeatScheduler`` stamps it into the
task kwargs at the moment beat applies the entry, computed from beat's OWN bookkeeping BEFORE the
entry is advanced: for an interval schedule the entry is due at ``last_run_at + run_every`` (exactly
the instant at which ``schedule.is_due(last_run_at)`` turns true), for other schedules at
``now + remaining_estimate(last_run_at)`` (negative remaining = overdue). For an entry that has never
run, beat treats it as due immediately, so its due time is the apply time.
Beat then sets ``last_run_at`` to the time it SENDS (not to the due time), so the next due time is
"send time + 1 s": a late tick pushes every later due time back instead of being caught up. The lag we
record (started - due) is therefore measured against beat's own, drifting, due times -- it does NOT
include the drift. The drift instead shows up as fewer fires than expected / skipped slots
(``run_peer.py`` counts, per job, nominal 1 s slots of the window with no fire). Nothing is
reconstructed from the start time (no ``round(started - x)``).
"""

from __future__ import annotations

import os
import time

from celery import Celery
from celery.schedules import schedule as interval_schedule
from celery.signals import beat_init
from redbeat.schedulers import RedBeatScheduler

REDIS_URL = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0")
JOBS = int(os.environ.get("PEER_JOBS", "200"))
INTERVAL = float(os.environ.get("PEER_INTERVAL", "1.0"))
NAMESPACE = os.environ.get("PEER_NAMESPACE", "peer")
TASK_NAME = "bench.peer_celery.app.record"

app = Celery("peer_celery")
app.conf.update(
    broker_url=REDIS_URL,
    broker_connection_retry_on_startup=True,
    task_default_queue=f"{NAMESPACE}-celery",
    task_ignore_result=True,  # no result backend, like most beat-driven periodic jobs
    timezone="UTC",
    enable_utc=True,
    redbeat_redis_url=REDIS_URL,
    redbeat_key_prefix=f"redbeat:{NAMESPACE}:",
    beat_schedule={
        f"job-{i:04d}": {
            "task": TASK_NAME,
            "schedule": INTERVAL,  # -> celery.schedules.schedule(timedelta(seconds=INTERVAL))
            "kwargs": {"job": f"job-{i:04d}"},
        }
        for i in range(JOBS)
    },
)
if os.environ.get("PEER_LOCK_TIMEOUT"):
    app.conf.redbeat_lock_timeout = float(os.environ["PEER_LOCK_TIMEOUT"])
if os.environ.get("PEER_MAX_LOOP_INTERVAL"):
    app.conf.beat_max_loop_interval = float(os.environ["PEER_MAX_LOOP_INTERVAL"])


_record_fd: tuple[int, int] | None = None  # (pid, fd): reopened after fork


def _fd() -> int:
    global _record_fd
    pid = os.getpid()
    if _record_fd is None or _record_fd[0] != pid:
        fd = os.open(os.environ["PEER_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _record_fd = (pid, fd)
    return _record_fd[1]


@app.task(name=TASK_NAME)
def record(job, slot_ts=None):
    started = time.time()  # first action: the moment the task body started
    # one O_APPEND write per execution: "job slot_ts started pid"
    os.write(_fd(), f"{job} {slot_ts!r} {started!r} {os.getpid()}\n".encode())


def _due_ts(entry) -> float:
    """Beat's own due time for ``entry`` (epoch seconds), read before the entry is advanced."""
    last = entry.last_run_at
    sched = entry.schedule
    if last is None:
        return time.time()  # never run: beat treats it as due right now
    if isinstance(sched, interval_schedule) and not sched.relative:
        return sched.maybe_make_aware(last).timestamp() + sched.run_every.total_seconds()
    return (sched.now() + sched.remaining_estimate(last)).timestamp()


class StampingRedBeatScheduler(RedBeatScheduler):
    """RedBeatScheduler that stamps the entry's due time into the task kwargs (``slot_ts``).

    Only adds one kwarg; locking, selection, advancing and sending are redbeat's/Celery's own code.
    """

    def apply_async(self, entry, producer=None, advance=True, **kwargs):
        due = _due_ts(entry)  # before reserve(): reserve sets last_run_at = now
        if advance:
            entry = self.reserve(entry)
        entry.kwargs = dict(entry.kwargs or {}, slot_ts=due)  # transient copy, not saved to Redis
        return super().apply_async(entry, producer=producer, advance=False, **kwargs)


# Connected after redbeat's own beat_init receiver (imported above), so it runs once the lock is
# held (a standby beat blocks inside redbeat's receiver until it gets the lock).
@beat_init.connect
def _note_lock_holder(sender=None, **kwargs):
    info_dir = os.environ.get("PEER_BEAT_INFO_DIR")
    scheduler = getattr(sender, "scheduler", None)
    lock = getattr(scheduler, "lock", None)
    if not info_dir or lock is None:
        return
    token = getattr(lock.local, "token", None)
    if isinstance(token, bytes):
        token = token.decode()
    path = os.path.join(info_dir, f"beat-{os.getpid()}.lock")
    with open(path + ".tmp", "w") as f:
        f.write(f"{os.getpid()} {token} {time.time()!r}\n")
    os.replace(path + ".tmp", path)
