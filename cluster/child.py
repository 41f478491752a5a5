"""Entry point of a process-isolated run.

A 'spawn' child unpickles its target by importing this module in a fresh interpreter, before Django
is set up: so nothing here may import models at module level.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

# How often a running child reports its output so far.
PROGRESS_INTERVAL_S = 1.0


def _stop(done: threading.Event, sending: threading.Lock) -> None:
    """No progress message after this (the final one follows, alone on the pipe)."""
    with sending:
        done.set()


def run_task(task_name: str, args: list, kwargs: dict, meta: dict, conn: Any) -> None:
    import django

    from cluster import affinity

    # The node may be pinned to one CPU; its task's own process is not (a CPU-bound task).
    affinity.restore(meta.get("cpus"))
    django.setup()
    from cluster.executor.output import call_task
    from jobs import registry, secrets
    from jobs.executions import jsonable_result

    context = registry.TaskContext(
        execution_id=meta["execution_id"],
        job_name=meta["job_name"],
        attempt=meta["attempt"],
        scheduled_for=meta.get("scheduled_for"),
        cancel_event=threading.Event(),
        # A child knows its claim only through its parent, which stops it when the run is
        # cancelled or times out: still_owner() here is "not cancelled".
        fencing_token=meta.get("fencing_token"),
        idempotency_key=meta.get("idempotency_key", ""),
    )
    revealed: list[str] = []
    sending = threading.Lock()
    done = threading.Event()

    def report_progress() -> None:
        """Send the output so far about once a second while it grows (the parent saves it)."""
        sent = 0
        while not done.wait(PROGRESS_INTERVAL_S):
            if context.size != sent:
                sent = context.size
                with sending:
                    if not done.is_set():
                        conn.send({"progress": secrets.scrub(context.output, revealed)})

    threading.Thread(target=report_progress, name="progress", daemon=True).start()
    try:
        spec = registry.get_task(task_name)
        # Secrets are resolved here, in the child: they never cross the pipe, and nothing the
        # child reports carries one.
        args, kwargs, revealed = secrets.resolve_call(args, kwargs)
        value = call_task(spec, args, kwargs, context)
        _stop(done, sending)
        conn.send(
            {
                "ok": True,
                "result": secrets.scrub(jsonable_result(value), revealed),
                "output": secrets.scrub(context.output, revealed),
            }
        )
    except BaseException as exc:  # report everything, including SystemExit, to the parent
        _stop(done, sending)
        conn.send(
            {
                "ok": False,
                "error": secrets.scrub(f"{type(exc).__name__}: {exc}", revealed),
                "traceback": secrets.scrub(traceback.format_exc(), revealed),
                "output": secrets.scrub(context.output, revealed),
            }
        )
    finally:
        conn.close()
