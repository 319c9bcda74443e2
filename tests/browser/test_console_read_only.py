"""Without web.token_file the console is read-only: no action buttons on any page, every action
POST is 403 whatever token it carries, a GET to an action URL is 405, and the database is
unchanged; unknown and malformed run ids in a path get 404 pages, in a query 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from ..acceptance.conftest import Cluster
from .conftest import TOKEN, Console, start_console


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("read-only"), token=None
    )


def test_no_buttons_on_any_page(console: Console, chrome: Any, tmp_path: Path) -> None:
    for name, path in (
        ("overview", "/"),
        ("runs", "/runs"),
        ("dead-run", f"/runs/{console.dead_id}"),
        ("schedules", "/schedules"),
    ):
        chrome.get(console.url + path)
        assert chrome.find_elements(By.TAG_NAME, "form") == [] or name == "runs", name
        assert chrome.find_elements(By.CSS_SELECTOR, 'form[method="post"]') == [], name
        assert chrome.find_elements(By.CSS_SELECTOR, 'input[name="token"]') == [], name
        assert "read-only" in chrome.find_element(By.TAG_NAME, "header").text
        chrome.save_screenshot(str(tmp_path / f"{name}.png"))


def test_every_action_is_refused_and_nothing_changes(console: Console) -> None:
    before = console.checksum()
    queued = console.sql("SELECT min(id) FROM runs WHERE status = 'queued'")[0][0]
    for action, form in (
        ("retry", {"run_id": str(console.dead_id)}),
        ("cancel", {"run_id": str(queued)}),
        ("trigger", {"schedule": "nightly_report"}),
        ("pause", {"schedule": "nightly_report"}),
        ("resume", {"schedule": "nightly_report"}),
    ):
        status, _, body = console.post(f"/actions/{action}", {**form, "token": TOKEN})
        assert status == 403 and "read-only" in body, action
        status, _, _ = console.post(
            f"/actions/{action}", form, {"Authorization": f"Bearer {TOKEN}"}
        )
        assert status == 403, action
        status, _ = console.get(f"/actions/{action}?run_id={console.dead_id}&token={TOKEN}")
        assert status == 405, action
    assert console.checksum() == before
    refused = [e for e in console.daemon.events() if e.get("event") == "console_action"]
    assert len(refused) == 10 and all(e["result"].startswith("forbidden") for e in refused)


def test_unknown_and_malformed_run_ids(console: Console, chrome: Any) -> None:
    assert console.get("/runs/999999")[0] == 404
    assert console.get("/runs/abc")[0] == 404  # changed by issue 22: no such page, like 999999
    assert console.get("/runs/" + "9" * 5000)[0] == 404
    assert console.get("/runs?before=abc")[0] == 400
    assert console.get("/runs?status=bogus")[0] == 400
    chrome.get(console.url + "/runs/999999")
    assert chrome.find_element(By.TAG_NAME, "h1").text == "404 Not Found"
    assert "run 999999 not found" in chrome.find_element(By.TAG_NAME, "main").text


def test_unreadable_or_empty_token_file_is_exit_2_naming_the_key(cluster: Cluster) -> None:
    absent, empty = cluster.tmp_path / "absent", cluster.tmp_path / "empty"
    empty.write_text("\n")
    for token_file, message in (
        (absent, f"web.token_file: cannot read {absent}: No such file or directory"),
        (empty, f"web.token_file: {empty} is empty"),
    ):
        config = cluster.config(f'[web]\nlisten = "127.0.0.1:0"\ntoken_file = "{token_file}"\n')
        daemon = cluster.start(config, wait=False)
        assert daemon.wait(timeout=30) == 2
        assert message in daemon.log()
