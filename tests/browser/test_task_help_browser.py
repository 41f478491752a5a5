"""The job editor knows the tasks (real Chromium): choosing one shows what it does and takes, and
its example fills the arguments."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import ConsoleLog, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_choosing_a_task_shows_its_arguments_and_fills_its_example(
    page: Page, console: ConsoleLog, make_user
) -> None:
    make_user("admin", "ann")
    login(page, "ann")
    page.goto("/jobs/new/")
    help_box = page.locator("#task-help")
    expect(help_box).to_be_hidden()

    page.select_option("#id_task", "http_request")
    expect(help_box).to_be_visible()
    expect(help_box).to_contain_text("Make an HTTP request")
    expect(help_box).to_contain_text("url (string), required")
    expect(help_box).to_contain_text('method (string), default "GET"')

    page.select_option("#id_task", "sleep")
    expect(help_box).to_contain_text("seconds (number), required")
    expect(help_box).not_to_contain_text("url (string)")
    page.get_by_role("button", name="Fill in the example").click()
    assert json.loads(page.input_value("#id_kwargs")) == {"seconds": 5}
    assert json.loads(page.input_value("#id_args")) == []

    page.select_option("#id_task", "noop")
    expect(help_box).to_contain_text("Takes no arguments.")
    expect(page.get_by_role("button", name="Fill in the example")).to_be_hidden()
    console.assert_clean()
