"""Every page under the strict Content-Security-Policy, in a real Chromium: the dashboard, the admin,
the browsable API and the API docs report no violation (the browser's own securitypolicyviolation
events, and no console error), and the node meters still show their fill (set from script, not by
a style attribute the policy would refuse)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page

from cluster.models import SchedulerNode
from jobs import services
from jobs.models import JobExecution, Trigger
from tests.browser.conftest import ConsoleLog, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(
    [event.violatedDirective, event.blockedURI || "inline", event.sourceFile, event.lineNumber,
     event.sample].join(" ")
  );
});
"""


def test_no_page_breaks_the_content_security_policy(
    page: Page, console: ConsoleLog, make_user
) -> None:
    user = make_user("admin", "ada")
    user.is_superuser = True  # the admin's change pages need model permissions
    user.save()
    job = services.job_create(
        data={
            "name": "csp-job",
            "task": "noop",
            "schedule_type": "interval",
            "interval_seconds": 60,
        },
        by=services.SYSTEM,
    )
    now = timezone.now()
    execution = JobExecution.objects.create(
        job=job, scheduled_for=now, run_after=now, trigger=Trigger.MANUAL, queue=job.queue
    )
    node = SchedulerNode.objects.create(
        node_id="csp-node",
        hostname="h",
        pid=1,
        started_at=now - timedelta(minutes=1),
        last_heartbeat=now + timedelta(hours=1),  # stays alive while the pages are looked at
        capacity=4,
        running_count=2,
    )
    page.add_init_script(RECORD_VIOLATIONS)
    login(page, "ada")
    paths = [
        "/",
        "/jobs/",
        f"/jobs/{job.pk}/",
        f"/jobs/{job.pk}/edit/",
        "/jobs/new/",
        "/executions/",
        f"/executions/{execution.pk}/",
        "/nodes/",
        f"/nodes/{node.pk}/",
        "/audit/",
        "/admin/",
        "/admin/jobs/job/",
        f"/admin/jobs/job/{job.pk}/change/",
        "/api/",
        "/api/jobs/",
        "/api/docs/",
        "/api/redoc/",
    ]
    violations: dict[str, list[str]] = {}
    for path in paths:
        response = page.goto(path)
        assert response is not None and response.status == 200, path
        assert response.headers.get("content-security-policy"), path
        page.wait_for_load_state("networkidle")
        found = page.evaluate("window.__cspViolations")
        if found:
            violations[path] = found
    assert not violations, violations
    page.goto(f"/nodes/{node.pk}/")
    # Two of four slots busy: the meter's fill grows (a CSS transition) to half its track.
    page.wait_for_function(
        """() => {
          const fill = document.querySelector(".meter__fill");
          const ratio = fill.getBoundingClientRect().width / fill.parentElement.getBoundingClientRect().width;
          return ratio > 0.45 && ratio < 0.55;
        }""",
        timeout=5_000,
    )
    # Redoc's logo is on its maker's CDN, which this machine cannot reach (no internet).
    console.errors = [e for e in console.errors if "https://cdn.redoc.ly/" not in e]
    console.assert_clean()
