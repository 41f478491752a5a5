"""A failure notification end to end (real Chromium, a real node, a local webhook receiver): an
admin adds a rule in the admin, a run fails on the node, the receiver gets the webhook and the
admin's notification log shows it sent."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from jobs import services
from jobs.models import Notification
from tests.browser.conftest import BrowserCluster, ConsoleLog, login
from tests.cluster.harness import wait_for
from tests.jobs.test_notifications import Receiver

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WAIT_S = 30.0


def test_a_failure_webhook_is_received(
    page: Page, console: ConsoleLog, make_user, cluster: BrowserCluster
) -> None:
    receiver = Receiver()
    try:
        make_user("admin", "ivy")
        job = services.job_create(
            data={
                "name": "nightly-import",
                "task": "demo_fail",
                "kwargs": {"message": "the upstream file is missing"},
                "schedule_type": "cron",
                "cron_expression": "0 0 1 1 *",
            },
            by=services.SYSTEM,
        )
        login(page, "ivy")
        page.goto("/admin/jobs/notificationrule/add/")
        page.fill("#id_name", "on-call")
        page.get_by_label("Failed").check()
        page.select_option("#id_channel", "webhook")
        page.fill("#id_target", receiver.url)
        with page.expect_navigation():
            page.click("input[name=_save]")
        expect(page.locator(".messagelist")).to_contain_text("was added successfully")

        cluster.start_nodes(1)
        page.goto(f"/jobs/{job.pk}/")
        with page.expect_navigation():
            page.get_by_role("button", name="Run nightly-import now").click()

        wait_for(lambda: receiver.requests, WAIT_S, interval=0.1)
        _, body = receiver.requests[0]
        assert body["event"] == "failed"
        assert body["job"]["name"] == "nightly-import"
        assert body["execution"]["error"] == "RuntimeError: the upstream file is missing"
        wait_for(lambda: Notification.objects.filter(status="sent").exists(), WAIT_S)

        page.goto("/admin/jobs/notification/")
        expect(page.locator("#result_list")).to_contain_text("on-call")
        expect(page.locator("#result_list")).to_contain_text("Sent")
        console.assert_clean()
    finally:
        receiver.close()
