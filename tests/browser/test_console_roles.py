"""Issue 46, Must show 3 (roles): a console with an operators' and a viewers' token. A viewer,
logged in under a name, sees every page and no action; a POST forged with the viewer's own
session and its valid CSRF token is 403 and changes nothing, as is one with the viewers' token
as a bearer. An operator logged in on the same console sees the actions and can act."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from .conftest import TOKEN, WEB, Console, start_console

VIEWER_TOKEN = "viewer-token-abcdefghijklmnop"
ROLES_WEB = WEB.replace(
    'token_file = "{token_file}"',
    'token_file = "{token_file}"\nviewer_token_file = "{viewer_token_file}"',
)


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn,
        template_db,
        tmp_path_factory.mktemp("roles"),
        token=TOKEN,
        viewer_token=VIEWER_TOKEN,
        web=ROLES_WEB,
    )


def log_in(chrome: Any, console: Console, name: str, token: str) -> None:
    chrome.delete_all_cookies()
    chrome.get(console.url + "/login")
    chrome.find_element(By.NAME, "name").send_keys(name)
    chrome.find_element(By.NAME, "token").send_keys(token)
    chrome.find_element(By.CSS_SELECTOR, "form#login button").click()
    WebDriverWait(chrome, 10).until(lambda d: d.current_url == console.url + "/")


def action_forms(chrome: Any) -> list[str]:
    """The actions of the page: every POST form but the logout."""
    forms = chrome.find_elements(By.CSS_SELECTOR, 'form[method="post"]')
    return [f.get_attribute("action") for f in forms if "logout" not in f.get_attribute("class")]


def pages(console: Console) -> list[str]:
    return [
        "/",
        "/runs",
        "/runs?status=dead",
        f"/runs/{console.dead_id}",
        "/schedules",
        "/types/report",
    ]


def test_a_viewer_sees_every_page_and_no_action(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    log_in(chrome, console, "Vera Viewer", VIEWER_TOKEN)
    for path in pages(console):
        chrome.get(console.url + path)
        assert chrome.find_element(By.ID, "who").text == "Vera Viewer (viewer)", path
        assert "read-only" in chrome.find_element(By.ID, "mode").text
        assert action_forms(chrome) == [], path
        assert chrome.find_elements(By.ID, "logout"), path  # a viewer can log out
    chrome.get(console.url + f"/runs/{console.dead_id}")
    chrome.save_screenshot(str(tmp_path / "viewer-run.png"))

    # the same pages for an operator have their actions
    log_in(chrome, console, "Olga Operator", TOKEN)
    chrome.get(console.url + f"/runs/{console.dead_id}")
    assert chrome.find_element(By.ID, "who").text == "Olga Operator (operator)"
    assert any(a.endswith("/actions/retry") for a in action_forms(chrome))
    chrome.get(console.url + "/schedules")
    assert any(a.endswith("/actions/trigger") for a in action_forms(chrome))


def test_a_viewers_forged_post_is_403_and_changes_nothing(console: Console) -> None:
    cookie = console.login(VIEWER_TOKEN, name="Vera Viewer")
    headers = {"Cookie": f"pgtick_session={cookie}"}
    status, page = console.get(f"/runs/{console.dead_id}", headers)
    assert status == 200 and "Vera Viewer (viewer)" in page
    found = re.search(r'name="csrf" value="([^"]+)"', page)  # the logout form's: valid
    assert found is not None
    csrf = found.group(1)
    before = console.checksum()
    for action, form in (
        ("retry", {"run_id": str(console.dead_id)}),
        ("cancel", {"run_id": str(console.dead_id)}),
        ("trigger", {"schedule": "nightly_report"}),
        ("pause", {"schedule": "nightly_report"}),
        ("resume", {"schedule": "nightly_report"}),
        ("pause-type", {"job_type": "report"}),
        ("limits", {"job_type": "report", "max_running": "1"}),
        ("bulk", {"action": "retry", "status": "dead", "ids": "1", "count": "1"}),
    ):
        status, _, body = console.post(f"/actions/{action}", {**form, "csrf": csrf}, headers)
        assert status == 403, (action, status)
        assert "Vera Viewer (viewer) cannot act" in body, body
        bearer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
        status, _, body = console.post(f"/actions/{action}", form, bearer)
        assert status == 403, (action, status)
        assert "viewers' token cannot act" in html.unescape(body)
    assert console.checksum() == before
    # the operator's session, with its own CSRF token, may
    op = {"Cookie": f"pgtick_session={console.login(TOKEN, name='Olga Operator')}"}
    found = re.search(r'name="csrf" value="([^"]+)"', console.get("/schedules", op)[1])
    assert found is not None
    status, location, _ = console.post(
        "/actions/pause", {"schedule": "hourly_sync", "csrf": found.group(1)}, op
    )
    assert status == 303 and "paused" in location
    assert console.checksum() != before
    # and the viewer logs out like anyone
    status, location, _ = console.post("/logout", {"csrf": csrf}, headers)
    assert (status, location) == (303, "/login")


def test_the_login_wants_a_name(console: Console) -> None:
    cookie, csrf = console.login_form()
    status, _, body = console.post("/login", {"token": VIEWER_TOKEN, "csrf": csrf}, cookie)
    assert status == 403 and "give your name" in body
