"""`make run`'s process manager seen from the dashboard (real `runcluster`, real Chromium): a node
SIGKILLed is restarted and the overview shows the new leader and the restarted process without a
reload; a node drained from its page stops and the web stays up."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from chaos.redis_server import free_port
from tests.browser.conftest import ConsoleLog, wait_live
from tests.cluster.harness import wait_for
from tests.cluster.test_runcluster import ROOT, answers, environment

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "a-Long-password-for-the-test-9"
LIVE_TIMEOUT_MS = 30_000


def manage(env: dict[str, str], *args: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )


def test_a_killed_node_comes_back_and_a_drained_one_stays_down(browser: Browser, tmp_path: Path):
    env = environment(tmp_path)
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "createuser", "olive", "--role", "operator", "--password", PASSWORD)
    port = free_port()
    log = tmp_path / "cluster.log"
    with log.open("w") as out:
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "runcluster", "--port", str(port), "--nodes", "2"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    context = browser.new_context(base_url=f"http://127.0.0.1:{port}")
    page = context.new_page()
    console = ConsoleLog()
    console.watch(page)
    page.set_default_timeout(LIVE_TIMEOUT_MS)
    try:
        wait_for(lambda: answers(port), 60)
        page.goto("/login/")
        page.fill("#id_username", "olive")
        page.fill("#id_password", PASSWORD)
        with page.expect_navigation():
            page.click("button[type=submit]")
        wait_live(page, LIVE_TIMEOUT_MS)

        def api(path: str) -> dict | list:
            reply = page.request.get(path)
            assert reply.ok, (path, reply.status)
            return reply.json()

        leader = wait_for(lambda: api("/api/cluster/")["leader"], 60)
        term = api("/api/cluster/")["term"]
        nodes = {n["node_id"]: n for n in api("/api/nodes/")["results"]}
        assert set(nodes) == {"node-1", "node-2"}, nodes
        page.goto("/")
        wait_live(page, LIVE_TIMEOUT_MS)
        page.evaluate("window.__noReload = true")
        card = page.locator(f'.node-card[data-node-id="{leader}"]')
        expect(card.locator(".leader-badge")).to_be_visible()

        os.kill(nodes[leader]["pid"], signal.SIGKILL)

        # A new term begins — usually the other node's, but the killed one, restarted after 1 s,
        # may campaign first once the lease has expired — and the killed one is restarted (a new
        # pid), all shown on this page.
        after = wait_for(
            lambda: (now := api("/api/cluster/"))["leader"] and (now["term"] or 0) > term and now,
            60,
        )
        expect(
            page.locator(f'.node-card[data-node-id="{after["leader"]}"] .leader-badge')
        ).to_contain_text(f"term {after['term']}", timeout=LIVE_TIMEOUT_MS)
        restarted = wait_for(
            lambda: re.search(rf"restarted {leader} \(pid (\d+)\)", log.read_text()), 60
        )
        expect(card).to_contain_text(f"pid {restarted.group(1)}", timeout=LIVE_TIMEOUT_MS)
        expect(card.locator(".badge")).to_have_text("active", timeout=LIVE_TIMEOUT_MS)
        assert page.evaluate("window.__noReload") is True

        # Drain the restarted node from its page: it stops, stays stopped, the web stays up.
        page.goto(f"/nodes/{nodes[leader]['id']}/")
        page.once("dialog", lambda dialog: dialog.accept())
        with page.expect_navigation():
            page.get_by_role("button", name=re.compile("^Drain")).click()
        wait_for(lambda: f"{leader} stopped (drained" in log.read_text(), 60)
        assert answers(port), log.read_text()
        page.goto("/")
        wait_live(page, LIVE_TIMEOUT_MS)
        expect(page.locator(f'.node-card[data-node-id="{leader}"] .badge')).to_have_text(
            "stopped", timeout=LIVE_TIMEOUT_MS
        )
        assert f"restarted {leader} (pid" in log.read_text()
        assert log.read_text().count(f"restarted {leader}") == 1
        assert cluster.poll() is None
        console.assert_clean()
    finally:
        context.close()
        if cluster.poll() is None:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(60)
            except subprocess.TimeoutExpired:
                cluster.kill()
                cluster.wait()
