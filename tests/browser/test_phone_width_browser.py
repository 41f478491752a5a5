"""At phone width (390 px, real Chromium) a job row's actions are on screen and usable."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from jobs import services
from tests.browser.conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}


def test_row_actions_are_on_screen_at_390_px(page_with, make_user):
    make_user("operator", "pia")
    job = services.job_create(
        data={
            "name": "a-job-with-a-rather-long-name-for-a-phone",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 3 * * *",
        },
        by=services.SYSTEM,
    )
    page, console = page_with(viewport=PHONE)
    login(page, "pia")
    page.goto("/jobs/")
    button = page.get_by_role("button", name=f"Pause {job.name}")
    expect(button).to_be_visible()
    box = button.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    with page.expect_navigation():
        button.click()
    expect(page.locator(".messages")).to_contain_text("paused")
    console.assert_clean()


@pytest.mark.parametrize("role", ["viewer", "admin"])
def test_overview_fits_390_px_and_sign_out_is_on_screen(page_with, make_user, role):
    """The whole header (an admin's carries the most links) wraps inside a phone's width: the page
    does not scroll sideways and Sign out stays on screen."""
    make_user(role, f"phone-{role}-with-a-longish-name")
    page, console = page_with(viewport=PHONE)
    login(page, f"phone-{role}-with-a-longish-name")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], f"the page is {width} px wide at {PHONE['width']} px"
    sign_out = page.get_by_role("button", name="Sign out")
    expect(sign_out).to_be_visible()
    box = sign_out.bounding_box()
    assert box is not None
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    console.assert_clean()
