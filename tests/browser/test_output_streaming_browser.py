"""A run's output streams into its page while it runs (real node, real Chromium): the first line
shows within 2 s of being written, the later ones as they come, with the time it has been running;
the whole output downloads as a file."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus as S
from tests.browser.conftest import BrowserCluster, ConsoleLog, login, wait_live
from tests.cluster.harness import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FIRST_LINE_WITHIN_S = 2.0
LIVE_TIMEOUT_MS = 20_000
# Long enough to open the page before the run starts on a loaded machine.
START_IN_S = 8


def test_a_tasks_lines_appear_while_it_runs(
    page: Page, console: ConsoleLog, make_user, cluster: BrowserCluster
) -> None:
    cluster.start_nodes(1)
    make_user("viewer", "vera")
    job = services.job_create(
        data={
            "name": "ticker",
            "task": "demo_ticker",
            "kwargs": {"seconds": 12, "interval": 1},
            "schedule_type": "cron",
            "cron_expression": "0 0 1 1 *",
            "concurrency_policy": "allow",
        },
        by=services.SYSTEM,
    )
    due = timezone.now() + timedelta(seconds=START_IN_S)
    (run,) = services.runs_enqueue(
        job_id=job.pk, items=[{"run_at": due.isoformat()}], by=services.SYSTEM
    )
    login(page, "vera")
    page.goto(f"/executions/{run.pk}/")
    wait_live(page)
    output = page.locator("#execution-output")
    status = page.locator('h1 [data-field="status"] .badge')
    assert timezone.now() < due, "the page opened after the run was due: raise START_IN_S"

    # The first line: seen on the page within 2 s of the task writing it (the body's start).
    expect(output).to_contain_text("tick 1 ", timeout=(START_IN_S + 20) * 1000)
    seen = timezone.now()
    started = wait_for(lambda: JobExecution.objects.get(pk=run.pk).started_at, 10, interval=0.05)
    assert (seen - started).total_seconds() < FIRST_LINE_WITHIN_S, (seen, started)

    # Later lines keep coming while it runs, with the time it has been running.
    expect(output).to_contain_text("tick 4 ", timeout=LIVE_TIMEOUT_MS)
    expect(status).to_have_attribute("data-status", "running")
    elapsed = page.locator('[data-field="elapsed"]')
    expect(elapsed).to_be_visible()
    first = elapsed.text_content()
    time.sleep(1.5)
    assert elapsed.text_content() != first
    assert "tick 12 " not in (output.text_content() or "")

    download = page.request.get(f"/executions/{run.pk}/output.txt")
    assert download.ok and "tick 1 " in download.text()
    assert "attachment" in download.headers["content-disposition"]

    expect(status).to_have_attribute("data-status", "succeeded", timeout=LIVE_TIMEOUT_MS)
    expect(output).to_contain_text("tick 12 ")
    expect(elapsed).to_be_hidden()
    assert JobExecution.objects.get(pk=run.pk).status == S.SUCCEEDED
    console.assert_clean()
