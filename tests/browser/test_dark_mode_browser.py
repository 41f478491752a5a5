"""Dark mode follows the system (real Chromium told to prefer dark): the page turns dark and what
it says stays readable (WCAG contrast of at least 4.5:1 for text on its background)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page

from jobs import services
from tests.browser.conftest import login
from tests.cluster.harness import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CONTRAST_JS = """
(selector) => {
  function rgb(text) { return text.match(/[\\d.]+/g).slice(0, 4).map(Number); }
  function lum(c) {
    const [r, g, b] = c.slice(0, 3).map(v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }
  function background(el) {
    for (let node = el; node; node = node.parentElement) {
      const c = rgb(getComputedStyle(node).backgroundColor);
      if (c.length < 4 || c[3] > 0) return c;
    }
    return [255, 255, 255];
  }
  const el = document.querySelector(selector);
  if (!el) return null;
  const fg = lum(rgb(getComputedStyle(el).color)), bg = lum(background(el));
  return {ratio: (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05), background: bg};
}
"""


def contrast(page: Page, selector: str) -> dict:
    found = page.evaluate(CONTRAST_JS, selector)
    assert found is not None, f"nothing matches {selector}"
    return found


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_the_dashboard_is_readable_in_both_schemes(page_with, make_user, scheme: str) -> None:
    make_user("operator", f"dora-{scheme}")
    job = services.job_create(
        data={
            "name": "contrast",
            "task": "noop",
            "schedule_type": "cron",
            "cron_expression": "0 3 * * *",
        },
        by=services.SYSTEM,
    )
    page, console = page_with(color_scheme=scheme)
    login(page, f"dora-{scheme}")
    page.goto("/jobs/")
    body = contrast(page, "body")
    assert (body["background"] < 0.05) == (scheme == "dark"), body
    with page.expect_navigation():
        page.get_by_role("button", name=f"Pause {job.name}").click()
    # Read the colours at rest (a live update flashes a row for a moment).
    wait_for(lambda: page.evaluate("() => document.getAnimations().length") == 0, 10)
    for selector in (
        "body",
        ".card",
        ".messages .message",
        "#job-table a.strong",
        ".badge--paused",
        ".main-nav a",
        ".filters label",
        ".muted",
    ):
        found = contrast(page, selector)
        assert found["ratio"] >= 4.5, (scheme, selector, found)
    console.assert_clean()
