"""Filters apply themselves in real Chromium: a choice at once, typed text after a pause, with the
cursor back in the search box; the executions list has a text search."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from jobs import services
from jobs.models import JobExecution
from jobs.states import ExecutionStatus as S
from tests.browser.conftest import ConsoleLog, login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _job(name: str):
    return services.job_create(
        data={
            "name": name,
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 0 1 1 *",
        },
        by=services.SYSTEM,
    )


def test_execution_filters_apply_without_a_click(
    page: Page, console: ConsoleLog, make_user
) -> None:
    make_user("viewer", "fay")
    now = timezone.now()
    runs = {}
    for name, status in (("alpha-report", S.SUCCEEDED), ("beta-sync", S.FAILED)):
        job = _job(name)
        runs[name] = JobExecution.objects.create(
            job=job, scheduled_for=now, run_after=now, status=status
        )
    login(page, "fay")
    page.goto("/executions/")
    wait_live(page)
    rows = page.locator("#execution-table tbody tr[data-execution-id]")
    expect(rows).to_have_count(2)

    with page.expect_navigation():
        page.select_option("#f-status", "failed")
    assert parse_qs(urlsplit(page.url).query)["status"] == ["failed"]
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-execution-id", str(runs["beta-sync"].pk))

    page.goto("/executions/")
    wait_live(page)
    with page.expect_navigation():
        page.locator("#f-q").press_sequentially("alpha", delay=40)
    assert parse_qs(urlsplit(page.url).query)["q"] == ["alpha"]
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-execution-id", str(runs["alpha-report"].pk))
    expect(page.locator("#f-q")).to_be_focused()
    expect(page.locator("#f-q")).to_have_value("alpha")
    console.assert_clean()
