"""The overview's charts in real Chromium: a count axis never repeats a label (one run in the last
hour drew "0 0 0 1 1 1")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page

from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus as S
from tests.browser.conftest import ConsoleLog, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

Y_LABELS = "#chart-throughput text.chart-label[text-anchor='end']"


@pytest.mark.parametrize(
    ("runs", "expected"), [(1, ["0", "1"]), (3, ["0", "1", "2", "3", "4", "5"])]
)
def test_the_throughput_axis_labels_are_distinct_whole_numbers(
    page: Page, console: ConsoleLog, make_user, runs: int, expected: list[str]
) -> None:
    make_user("viewer", "vic")
    job = services.job_create(
        data={
            "name": "counted",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 0 1 1 *",
        },
        by=services.SYSTEM,
    )
    now = timezone.now()
    for i in range(runs):
        at = now - timedelta(seconds=5 + i)
        JobExecution.objects.create(
            job=job,
            scheduled_for=at,
            run_after=at,
            status=S.SUCCEEDED,
            started_at=at,
            finished_at=now - timedelta(seconds=1),
            duration_ms=5,
        )
    login(page, "vic")
    page.wait_for_selector(Y_LABELS)
    labels = page.locator(Y_LABELS).all_text_contents()
    assert labels == expected
    console.assert_clean()
