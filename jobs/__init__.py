from typing import Any


def enqueue(job: Any, **options: Any) -> Any:
    """Enqueue a run of ``job`` (a Job, its name or its id) from application code, inside the
    caller's transaction: ``jobs.client.enqueue``, which names the options."""
    from jobs.client import enqueue as enqueue_run

    return enqueue_run(job, **options)
