"""Times say their zone, and a header switch shows them in UTC or the viewer's zone, remembered
per user (real Chromium in New York time); a cron job's next fire is shown in the job's own zone."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from jobs import services
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CREATED = 'dd[data-field="next_fire_at"] time'


def test_the_utc_switch_is_remembered_per_user(page_with, make_user) -> None:
    make_user("viewer", "nina")
    make_user("viewer", "omar")
    job = services.job_create(
        data={
            "name": "berlin-night",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 3 * * *",
            "timezone": "Europe/Berlin",
        },
        by=services.SYSTEM,
    )
    page, console = page_with(timezone_id="America/New_York", locale="en-US")
    login(page, "nina")
    page.goto(f"/jobs/{job.pk}/")
    next_fire = page.locator(CREATED)
    # In the job's zone, saying so (Berlin is GMT+1 or GMT+2); 03:00 there.
    expect(next_fire).to_have_text(re.compile(r"03:00:00 GMT\+[12]$"))
    switch = page.locator("#time-mode")
    expect(switch).to_have_text("Local time")
    created = page.locator("time:not([data-zone]):not([data-format])").first
    expect(created).to_have_text(re.compile(r"E[SD]T$"))

    switch.click()
    expect(switch).to_have_text("UTC")
    expect(switch).to_have_attribute("aria-pressed", "true")
    expect(created).to_have_text(re.compile(r"UTC$"))
    expect(next_fire).to_have_text(re.compile(r"03:00:00 GMT\+[12]$"))  # still the job's zone

    page.reload()
    expect(page.locator("#time-mode")).to_have_text("UTC")
    expect(page.locator("time:not([data-zone]):not([data-format])").first).to_have_text(
        re.compile(r"UTC$")
    )

    # Another user in the same browser keeps their own choice (local time).
    page.context.clear_cookies()
    login(page, "omar")
    expect(page.locator("#time-mode")).to_have_text("Local time")
    console.assert_clean()
