"""The dashboard in a real Chromium against a real daphne and real ``runnode`` processes.

Every test signs in through /login/, drives the pages like an operator would and checks two things
besides what it is about: live changes arrive without the page reloading (a marker set in the page
survives, and no main-frame navigation happens), and the browser logged no error.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import BrowserContext, Page, expect

import tests.cluster.tasks  # noqa: F401 - registers test.fail here, for job validation
from cluster.models import LeadershipTerm, SchedulerNode
from jobs import services
from jobs.models import AuditEvent, Job, JobExecution
from jobs.states import ExecutionStatus as S
from tests.browser.conftest import (
    PASSWORD,
    BrowserCluster,
    ConsoleLog,
    login,
    wait_live,
)
from tests.cluster.harness import current_leader, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The README's screenshots are refreshed with UPDATE_SCREENSHOTS=1; otherwise they go to a
# temporary folder, so a test run leaves the work tree as it was.
README_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
LIVE_TIMEOUT_MS = 20_000
EVERY_TWO_SECONDS = re.compile(r"\b2 seconds\b", re.I)
# Rows of a live execution table (the list, the job's history or the overview's latest runs).
ROW = 'tr[data-execution-id="{id}"]'
ACTION_SELECTORS = {
    "create": 'a[href="/jobs/new/"]',
    "edit": 'a[href$="/edit/"]',
    "delete": 'a[href$="/delete/"], form[action$="/delete/"]',
    "trigger": 'form[action$="/trigger/"]',
    "pause": 'form[action$="/pause/"]',
    "resume": 'form[action$="/resume/"]',
    "cancel": 'form[action$="/cancel/"]',
    "retry": 'form[action$="/retry/"]',
    "drain": 'form[action$="/drain/"]',
}


# --- helpers ---------------------------------------------------------------------------------------


class NoReload:
    """Proof that a page was not reloaded: a random marker kept in ``window`` and a count of
    main-frame navigations, both checked by ``assert_kept``."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.navigations = 0
        page.on("framenavigated", self._navigated)
        self.marker = page.evaluate("() => (window.__noReload = String(Math.random()))")

    def _navigated(self, frame: object) -> None:
        if frame == self.page.main_frame:
            self.navigations += 1

    def assert_kept(self) -> None:
        assert self.navigations == 0, "the page navigated"
        assert self.page.evaluate("() => window.__noReload") == self.marker, "the page reloaded"


def open_page(page: Page, path: str) -> None:
    page.goto(path)
    wait_live(page)


def new_watched_page(context: BrowserContext, console: ConsoleLog, path: str) -> Page:
    other = console.watch(context.new_page())
    other.set_default_timeout(LIVE_TIMEOUT_MS)
    open_page(other, path)
    return other


def row_status(page: Page, table: str, execution_id: int, status: str) -> None:
    """Wait until ``table`` shows the execution with ``status`` (as its row and its badge)."""
    row = page.locator(f"{table} {ROW.format(id=execution_id)}")
    expect(row).to_have_attribute("data-status", status, timeout=LIVE_TIMEOUT_MS)
    expect(row.locator(f'[data-col="status"] [data-status="{status}"]')).to_be_visible()


def make_job(name: str, task: str, **fields: object) -> Job:
    data = {"name": name, "task": task, "schedule_type": "cron", **fields}
    return services.job_create(data=data, by=services.SYSTEM)


def newest(job: Job, **filters: object) -> JobExecution | None:
    return JobExecution.objects.filter(job=job, **filters).order_by("-id").first()


# --- the job editor ----------------------------------------------------------------------------------


def test_admin_creates_a_cron_job_with_a_live_preview(page: Page, console: ConsoleLog, make_user):
    make_user("admin", "alice")
    login(page, "alice")
    open_page(page, "/jobs/new/")

    page.fill("#id_name", "every-two-seconds")
    page.select_option("#id_task", "noop")
    expect(page.locator("#id_schedule_type_0")).to_be_checked()  # cron is the default type
    cron = page.locator("#id_cron_expression")
    cron.fill("")
    cron.press_sequentially("*/2 * * * * *", delay=40)  # typed, not pasted
    fires = page.locator("#preview-table li")
    description = page.locator("#preview-description")
    state = page.locator("#preview-state")

    def expect_preview() -> None:
        # Description, list and state are written together when the server's answer arrives.
        expect(description).to_contain_text(EVERY_TWO_SECONDS, timeout=LIVE_TIMEOUT_MS)
        expect(state).to_have_text("Next 5 fire times:")
        expect(page.locator("#preview-table")).to_be_visible()
        expect(fires).to_have_count(5)

    expect_preview()
    # Two seconds apart, in order.
    times = [t.get_attribute("datetime") for t in fires.locator("time.fire-list__job").all()]
    stamps = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t in times]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)] == [2.0] * 4

    # A bad cron: an inline error under the field, the preview cleared.
    cron.fill("")
    cron.press_sequentially("61 * * * *", delay=40)
    error = page.locator('[data-preview-error="cron_expression"]')
    expect(error).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(error).not_to_be_empty()
    expect(cron).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#preview-table")).to_be_hidden()
    expect(description).to_have_text("—")

    # Fixed again: the error goes away and the preview comes back; then save.
    cron.fill("*/2 * * * * *")
    expect(error).to_be_hidden(timeout=LIVE_TIMEOUT_MS)
    expect_preview()
    described = description.inner_text()
    with page.expect_navigation():
        page.get_by_role("button", name="Create job").click()
    job = Job.objects.get(name="every-two-seconds")
    assert page.url.endswith(f"/jobs/{job.pk}/")
    assert (job.cron_expression, job.task, job.enabled) == ("*/2 * * * * *", "noop", True)
    expect(page.locator(".messages")).to_contain_text("created")
    expect(page.locator('#job-header [data-field="schedule_description"]')).to_have_text(described)
    assert AuditEvent.objects.filter(action="job.create", actor_name="alice").exists()
    console.assert_clean()


# --- live executions, pause, resume, run now ---------------------------------------------------------


def test_runs_appear_live_and_pause_resume_run_now_work(
    page: Page, context: BrowserContext, console: ConsoleLog, make_user, cluster: BrowserCluster
):
    cluster.start_nodes(2)
    make_user("operator", "olga")
    login(page, "olga")
    open_page(page, "/executions/")
    watcher = NoReload(page)
    table = "#execution-table"

    # A job that fires every 2 s and runs for 1 s: its runs show up, run and succeed on the page.
    job = make_job("ticker", "sleep", kwargs={"seconds": 1}, cron_expression="*/2 * * * * *")
    running = page.locator(f'{table} tbody tr[data-status="running"]').first
    expect(running).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    first_id = int(running.get_attribute("data-execution-id"))
    row_status(page, table, first_id, "succeeded")
    assert JobExecution.objects.get(pk=first_id).status == S.SUCCEEDED
    watcher.assert_kept()

    # Pause from the job's page.
    actions = new_watched_page(context, console, f"/jobs/{job.pk}/")
    with actions.expect_navigation():
        actions.get_by_role("button", name="Pause ticker").click()
    expect(actions.locator(".messages")).to_contain_text("paused")
    job.refresh_from_db()
    assert job.enabled is False
    expect(actions.locator('#job-header [data-field="state"]')).to_have_text("Paused")
    expect(actions.get_by_role("button", name="Resume ticker")).to_be_visible()
    expect(actions.get_by_role("button", name="Pause ticker")).to_be_hidden()
    # Whatever was already handed out finishes; then nothing new is scheduled.
    wait_for(
        lambda: (
            not JobExecution.objects.filter(job=job, status__in=[S.PENDING, S.RUNNING]).exists()
        ),
        20,
    )
    last_scheduled = newest(job).pk

    # Run now while paused: exactly one manual run, shown live on the executions page.
    wait_live(actions)
    with actions.expect_navigation():
        actions.get_by_role("button", name="Run ticker now").click()
    manual = JobExecution.objects.get(job=job, trigger="manual")
    assert manual.pk > last_scheduled
    expect(actions.locator(".messages")).to_contain_text(f"execution #{manual.pk}")
    row_status(page, table, manual.pk, "succeeded")
    expect(page.locator(f"{table} {ROW.format(id=manual.pk)} [data-col=trigger]")).to_have_text(
        "Manual"
    )
    # ... and on the job's own page, which also follows it without a reload.
    wait_live(actions)
    row_status(actions, "#job-history", manual.pk, "succeeded")
    assert newest(job, trigger="schedule").pk == last_scheduled, "a paused job fired"

    # Resume: the schedule picks up again and its runs appear.
    with actions.expect_navigation():
        actions.get_by_role("button", name="Resume ticker").click()
    job.refresh_from_db()
    assert job.enabled is True
    expect(actions.locator('#job-header [data-field="state"]')).to_have_text("Enabled")
    resumed = wait_for(
        lambda: JobExecution.objects.filter(job=job, trigger="schedule", pk__gt=manual.pk).first(),
        20,
    )
    row_status(page, table, resumed.pk, "succeeded")
    watcher.assert_kept()
    actions.close()
    console.assert_clean()


# --- cancel a long run -------------------------------------------------------------------------------


def test_cancel_a_long_run_shows_cancelled_live(
    page: Page, context: BrowserContext, console: ConsoleLog, make_user, cluster: BrowserCluster
):
    cluster.start_nodes(2)
    make_user("operator", "olga")
    # Never fires by itself within the test (once a year); it is run by hand.
    job = make_job("long-sleep", "sleep", kwargs={"seconds": 60}, cron_expression="0 0 1 1 *")
    login(page, "olga")

    # The executions list stays open in a second tab: it must follow the cancel without a reload.
    listing = new_watched_page(context, console, "/executions/")
    watcher = NoReload(listing)

    open_page(page, f"/jobs/{job.pk}/")
    with page.expect_navigation():
        page.get_by_role("button", name="Run long-sleep now").click()
    execution = JobExecution.objects.get(job=job)
    row_status(listing, "#execution-table", execution.pk, "running")

    open_page(page, f"/executions/{execution.pk}/")
    status = page.locator('h1 [data-field="status"] .badge')
    expect(status).to_have_attribute("data-status", "running", timeout=LIVE_TIMEOUT_MS)
    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel execution #n?"
    with page.expect_navigation():
        page.get_by_role("button", name="Cancel run").click()
    detail = NoReload(page)
    wait_live(page)
    expect(status).to_have_attribute("data-status", "cancelled", timeout=LIVE_TIMEOUT_MS)
    expect(status).to_have_text("Cancelled")
    expect(page.locator('form[data-action="cancel"]')).to_be_hidden()
    row_status(listing, "#execution-table", execution.pk, "cancelled")

    execution.refresh_from_db()
    assert execution.status == S.CANCELLED
    assert execution.finished_at is not None
    assert (execution.finished_at - execution.started_at) < timedelta(seconds=30)
    detail.assert_kept()
    watcher.assert_kept()
    listing.close()
    console.assert_clean()


def test_cancelled_run_keeps_what_the_task_wrote_while_stopping(
    page: Page, console: ConsoleLog, make_user, cluster: BrowserCluster
):
    cluster.start_nodes(1)
    make_user("operator", "olga")
    job = make_job("long-sleep", "sleep", kwargs={"seconds": 60}, cron_expression="0 0 1 1 *")
    execution = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    wait_for(lambda: JobExecution.objects.filter(pk=execution.pk, status=S.RUNNING).exists(), 20)
    login(page, "olga")
    open_page(page, f"/executions/{execution.pk}/")
    page.once("dialog", lambda dialog: dialog.accept())
    with page.expect_navigation():
        page.get_by_role("button", name="Cancel run").click()
    status = page.locator('h1 [data-field="status"] .badge')
    expect(status).to_have_attribute("data-status", "cancelled", timeout=LIVE_TIMEOUT_MS)
    console.assert_clean()
    execution.refresh_from_db()
    assert "cancelled after" in execution.output, repr(execution.output)
    expect(page.locator("#execution-output")).to_contain_text("cancelled after")


# --- leader failover ---------------------------------------------------------------------------------


def test_killed_leader_is_replaced_on_the_overview_without_reload(
    page: Page, console: ConsoleLog, make_user, cluster: BrowserCluster
):
    old_leader, old_term = cluster.start_nodes(3)
    make_user("viewer", "vic")
    login(page, "vic")  # lands on the overview
    summary = page.locator("#cluster-summary")
    expect(summary).to_contain_text(f"Leader {old_leader} · term {old_term}")
    expect(page.locator(f'.node-card[data-node-id="{old_leader}"] .leader-badge')).to_have_text(
        f"★ Leader · term {old_term}"
    )
    watcher = NoReload(page)

    cluster.nodes[old_leader].signal(signal.SIGKILL)
    cluster.nodes[old_leader].wait(5)
    new_leader, new_term = wait_for(
        lambda: (leader := current_leader()) and leader[0] != old_leader and leader, 30
    )
    assert new_term > old_term

    expect(summary).to_contain_text(
        f"Leader {new_leader} · term {new_term}", timeout=LIVE_TIMEOUT_MS
    )
    expect(page.locator(f'.node-card[data-node-id="{new_leader}"] .leader-badge')).to_have_text(
        f"★ Leader · term {new_term}"
    )
    expect(page.locator(".leader-badge")).to_have_count(1)
    # The killed node stops heartbeating: after the dead threshold it is shown dead.
    expect(page.locator(f'.node-card[data-node-id="{old_leader}"] .badge')).to_have_text(
        "dead", timeout=LIVE_TIMEOUT_MS
    )
    # The timeline table lists both terms, the new one current.
    page.get_by_text("Terms as a table").click()
    rows = page.locator("#terms-table tbody tr")
    expect(rows.first).to_contain_text(str(new_term))
    expect(rows.first).to_contain_text("current")
    assert LeadershipTerm.objects.filter(term=old_term).exists()
    watcher.assert_kept()
    console.assert_clean()


# --- roles -------------------------------------------------------------------------------------------


def _action_counts(page: Page) -> dict[str, int]:
    return {name: page.locator(selector).count() for name, selector in ACTION_SELECTORS.items()}


def test_viewer_sees_no_actions_and_a_forged_post_is_refused(
    page: Page, new_context, console: ConsoleLog, make_user
):
    make_user("viewer", "vera")
    make_user("operator", "otto")
    job = make_job("parked", "noop", cron_expression="0 0 1 1 *", queue="nobody-serves-this")
    pending = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    failed = services.job_trigger(job_id=job.pk, by=services.SYSTEM)
    now = timezone.now()
    JobExecution.objects.filter(pk=failed.pk).update(status=S.FAILED, finished_at=now)
    node = SchedulerNode.objects.create(
        node_id="idle-node", hostname="h", pid=1, started_at=now, last_heartbeat=now
    )
    pages = {
        "/": set(),
        "/jobs/": {"trigger", "pause"},
        f"/jobs/{job.pk}/": {"trigger", "pause"},
        "/executions/": set(),
        f"/executions/{pending.pk}/": {"cancel"},
        f"/executions/{failed.pk}/": {"retry"},
        "/nodes/": {"drain"},
        f"/nodes/{node.pk}/": {"drain"},
    }

    # Control: an operator sees the buttons these selectors look for.
    operator_page = console.watch(new_context().new_page())
    login(operator_page, "otto")
    for path, expected in pages.items():
        open_page(operator_page, path)
        counts = _action_counts(operator_page)
        assert all(counts[name] for name in expected), (path, counts)

    login(page, "vera")
    for path in pages:
        open_page(page, path)
        counts = _action_counts(page)
        assert not any(counts.values()), (path, counts)
        for label in ("Run now", "Pause", "Resume", "Cancel run", "Retry", "Drain", "New job"):
            assert page.get_by_role("button", name=label, exact=True).count() == 0, (path, label)
            assert page.get_by_role("link", name=label, exact=True).count() == 0, (path, label)
    # The job editor is refused too.
    assert page.request.get("/jobs/new/").status == 403

    # Forged POSTs with the viewer's session cookie and a valid CSRF token: refused, nothing changed.
    open_page(page, f"/jobs/{job.pk}/")
    token = page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    before = (JobExecution.objects.count(), AuditEvent.objects.count())

    def forge(browser_page: Page, path: str, csrf: str) -> int:
        response = browser_page.request.post(
            path,
            form={"csrfmiddlewaretoken": csrf, "next": "/"},
            headers={"X-CSRFToken": csrf},
            max_redirects=0,
        )
        return response.status

    for path in (
        f"/jobs/{job.pk}/trigger/",
        f"/jobs/{job.pk}/pause/",
        f"/jobs/{job.pk}/delete/",
        f"/executions/{pending.pk}/cancel/",
        f"/executions/{failed.pk}/retry/",
        f"/nodes/{node.pk}/drain/",
    ):
        assert forge(page, path, token) == 403, path
    job.refresh_from_db()
    pending.refresh_from_db()
    node.refresh_from_db()
    assert job.enabled and pending.status == S.PENDING and not node.drain_requested
    assert (JobExecution.objects.count(), AuditEvent.objects.count()) == before

    # The same request from the operator's session (its own token) goes through: the 403 above was
    # the role, not a broken token.
    open_page(operator_page, f"/jobs/{job.pk}/")
    operator_token = operator_page.locator("input[name=csrfmiddlewaretoken]").first.input_value()
    assert forge(operator_page, f"/jobs/{job.pk}/trigger/", operator_token) == 302
    assert JobExecution.objects.count() == before[0] + 1
    console.assert_clean()


# --- screenshots for the README ----------------------------------------------------------------------


def test_screenshots_of_overview_jobs_nodes_and_a_running_execution(
    page: Page, console: ConsoleLog, make_user, cluster: BrowserCluster, tmp_path: Path
):
    cluster.start_nodes(3)
    make_job(
        "heartbeat-log",
        "log",
        kwargs={"message": "heartbeat: all systems nominal"},
        cron_expression="*/2 * * * * *",
        description="Writes a line to the log every two seconds.",
    )
    make_job("nightly-report", "sleep", kwargs={"seconds": 1.5}, cron_expression="*/3 * * * * *")
    make_job("hourly-cleanup", "noop", cron_expression="0 * * * *", timezone="Europe/Berlin")
    make_job(
        "flaky-import",
        "test.fail",
        kwargs={"message": "upstream returned 503"},
        cron_expression="*/5 * * * * *",
    )
    make_user("admin", "alice")
    login(page, "alice")
    watcher = NoReload(page)
    # A few seconds of work: successes, a failure, runs in flight.
    wait_for(lambda: JobExecution.objects.filter(status=S.SUCCEEDED).count() >= 6, 30)
    wait_for(lambda: JobExecution.objects.filter(status=S.FAILED).exists(), 20)
    expect(page.locator("#recent-executions tbody tr")).to_have_count(10)
    expect(page.locator("#chart-throughput .chart__loading")).to_have_count(0)
    page.wait_for_timeout(700)  # the charts redraw at most twice a second
    watcher.assert_kept()
    shots = README_SCREENSHOTS if os.environ.get("UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=shots / "overview.png", animations="disabled")

    open_page(page, "/jobs/")
    expect(page.locator("#job-table tbody tr")).to_have_count(4)
    page.screenshot(path=shots / "jobs.png", animations="disabled")

    open_page(page, "/nodes/")
    expect(page.locator(".leader-badge")).to_have_count(1)
    page.screenshot(path=shots / "nodes.png", animations="disabled")

    # A run caught while its output streams in (the demo ticker writes a line a second).
    ticker = make_job(
        "demo-ticker",
        "demo_ticker",
        kwargs={"seconds": 20, "interval": 1},
        schedule_type="once",
        run_at=timezone.now() + timedelta(days=1),
    )
    execution = services.job_trigger(job_id=ticker.pk, by=services.SYSTEM)
    open_page(page, f"/executions/{execution.pk}/")
    expect(page.locator("#execution-output")).to_contain_text("tick 4", timeout=20_000)
    page.screenshot(path=shots / "execution.png", animations="disabled")
    for name in ("overview", "jobs", "nodes", "execution"):
        assert (shots / f"{name}.png").stat().st_size > 10_000
    console.assert_clean()


def test_login_page_rejects_a_wrong_password(page: Page, console: ConsoleLog, make_user):
    make_user("viewer", "vera")
    page.goto("/login/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", PASSWORD + "x")
    page.click("button[type=submit]")
    expect(page.locator(".alert--error")).to_be_visible()
    assert page.url.endswith("/login/")
    console.assert_clean()
