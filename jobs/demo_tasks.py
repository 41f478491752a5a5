"""Demo tasks: what a newcomer needs to see retries, failures and streaming output without writing
code. Registered when ``SCHEDULER_DEMO_TASKS`` is on (the default; production settings turn it off).

- ``demo_ticker``: writes a numbered line every ``interval`` seconds for ``seconds`` seconds (watch the
  run's output stream in), returns how many lines it wrote; stops early when cancelled.
- ``demo_fail``: writes a line, then fails with ``message`` (watch retries and their backoff).
- ``demo_report``: succeeds with a small result (the run page shows it as JSON).
- ``demo_flaky``: fails at random with probability ``fail_rate`` (watch retries end in success).
"""

from __future__ import annotations

import random
import time
from typing import Any

from jobs.registry import TaskArgumentError, TaskContext, task

MAX_TICKER_S = 3600


def _check_ticker(args: list, kwargs: dict) -> None:
    values = dict(zip(("seconds", "interval"), args, strict=False)) | kwargs
    for name, low, high in (("seconds", 0, MAX_TICKER_S), ("interval", 0.1, 60)):
        value = values.get(name)
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            raise TaskArgumentError(
                "kwargs" if name in kwargs else "args",
                f"{name} must be a number between {low} and {high}, got {value!r}",
            )


@task(
    "demo_ticker",
    takes_context=True,
    validate=_check_ticker,
    example={"kwargs": {"seconds": 12, "interval": 1}},
)
def demo_ticker(seconds: float = 12, interval: float = 1.0, *, context: TaskContext) -> dict:
    """Write a numbered line every interval seconds for a while (streams into the run's output)."""
    started = time.monotonic()
    lines = 0
    while time.monotonic() - started < seconds:
        lines += 1
        context.log(f"tick {lines} at {time.monotonic() - started:.1f}s")
        if context.cancel_event.wait(interval):
            context.log("cancelled")
            break
    return {"lines": lines}


@task("demo_fail", takes_context=True, example={"kwargs": {"message": "no luck this time"}})
def demo_fail(message: str = "this run fails on purpose", *, context: TaskContext) -> None:
    """Write a line, then fail with the given message (shows retries and the error)."""
    context.log(f"attempt {context.attempt}: about to fail")
    raise RuntimeError(message)


@task("demo_report", takes_context=True)
def demo_report(*, context: TaskContext) -> dict[str, Any]:
    """Succeed with a small result (shows a run's result)."""
    context.log("report ready")
    return {"job": context.job_name, "attempt": context.attempt, "rows": 3, "ok": True}


def _check_flaky(args: list, kwargs: dict) -> None:
    value = dict(zip(("fail_rate",), args, strict=False)) | kwargs
    rate = value.get("fail_rate")
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1
    ):
        raise TaskArgumentError(
            "kwargs" if "fail_rate" in kwargs else "args",
            f"fail_rate must be a number between 0 and 1, got {rate!r}",
        )


@task(
    "demo_flaky",
    takes_context=True,
    validate=_check_flaky,
    example={"kwargs": {"fail_rate": 0.5}},
)
def demo_flaky(fail_rate: float = 0.5, *, context: TaskContext) -> dict[str, Any]:
    """Fail at random with probability fail_rate (shows retries that end in success)."""
    if random.random() < fail_rate:
        context.log(f"attempt {context.attempt}: unlucky, failing")
        raise RuntimeError(f"failed at random (fail_rate {fail_rate})")
    context.log(f"attempt {context.attempt}: succeeded")
    return {"attempt": context.attempt}
