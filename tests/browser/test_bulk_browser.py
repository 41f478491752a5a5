"""Bulk actions in real Chromium: select three jobs, pause them in one go; the bar counts the
selection, the header box selects every row."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from jobs import services
from jobs.models import AuditEvent, Job
from tests.browser.conftest import ConsoleLog, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_bulk_pause_of_three_jobs(page: Page, console: ConsoleLog, make_user) -> None:
    make_user("operator", "otto")
    jobs = [
        services.job_create(
            data={
                "name": f"batch-{i}",
                "task": "noop",
                "schedule_type": "interval",
                "interval_seconds": 3600,
            },
            by=services.SYSTEM,
        )
        for i in range(4)
    ]
    login(page, "otto")
    page.goto("/jobs/")
    bar = page.locator("#bulk-jobs")
    expect(bar).to_be_hidden()
    for job in jobs[:3]:
        page.get_by_label(f"Select {job.name}").check()
    expect(bar).to_be_visible()
    expect(bar.locator("[data-bulk-count]")).to_have_text("3 selected")
    with page.expect_navigation():
        bar.get_by_role("button", name="Pause selected").click()
    expect(page.locator(".messages")).to_contain_text("3 jobs paused")
    for job in jobs[:3]:
        row = page.locator(f'tr[data-job-id="{job.pk}"]')
        expect(row.locator(".badge--paused")).to_be_visible()
    expect(page.locator(f'tr[data-job-id="{jobs[3].pk}"] .badge--enabled')).to_be_visible()
    assert set(Job.objects.filter(enabled=False).values_list("name", flat=True)) == {
        "batch-0",
        "batch-1",
        "batch-2",
    }
    assert AuditEvent.objects.filter(action="job.pause", actor_name="otto").count() == 3

    page.get_by_label("Select every job shown").check()
    expect(bar.locator("[data-bulk-count]")).to_have_text("4 selected")
    page.get_by_label("Select every job shown").uncheck()
    expect(bar).to_be_hidden()
    console.assert_clean()
