"""A node's heartbeat age is judged by the node's own timing (it records its heartbeat interval and
presence TTL): the same age is "late" for a node that beats every 2 s and "dead" for one that
beats every 0.5 s, on the page as rendered and as the live feed redraws it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from cluster.models import SchedulerNode
from tests.browser.conftest import ConsoleLog, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_heartbeat_ages_follow_each_nodes_own_timing(page: Page, console: ConsoleLog, make_user):
    make_user("viewer", "vic")
    beat = timezone.now() - timedelta(seconds=5)
    for node_id, heartbeat, dead in (("fast-beat", 0.5, 2.0), ("slow-beat", 2.0, 10.0)):
        SchedulerNode.objects.create(
            node_id=node_id,
            hostname="h",
            pid=1,
            started_at=beat - timedelta(minutes=1),
            last_heartbeat=beat,
            heartbeat_interval_s=heartbeat,
            dead_after_s=dead,
        )
    login(page, "vic")
    page.goto("/nodes/")
    fast = page.locator('tr:has-text("fast-beat") time[data-format="age"]')
    slow = page.locator('tr:has-text("slow-beat") time[data-format="age"]')
    expect(fast).to_have_class("age--dead")
    expect(slow).to_have_class("age--late")  # 5 s: past 2 x 2 s, well inside its 10 s
    console.assert_clean()
