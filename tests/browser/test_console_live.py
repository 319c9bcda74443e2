"""Issue 46, Must show 1 (live updates): a run's state change appears on an open runs page
within 2 s without a reload (the page's own script, under its CSP nonce, swaps the fresh
rows in); with scripts disabled every page still renders whole, and those that followed the
database before still reload themselves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from .conftest import CHROMEDRIVER, CHROMIUM, TOKEN, Console, start_console

SEEN_WITHIN_SECONDS = 2.0


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("live"), token=TOKEN
    )


@pytest.fixture(scope="module")
def no_scripts() -> Iterator[Any]:
    """Chromium with JavaScript disabled."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs", {"profile.managed_default_content_settings.javascript": 2}
    )
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


def status_of(chrome: Any, run_id: int) -> str:
    found = chrome.find_elements(By.CSS_SELECTOR, f'tr[data-run-id="{run_id}"] .status')
    return str(found[0].text) if found else ""


def test_a_state_change_appears_on_an_open_runs_page_without_a_reload(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    [(run_id,)] = console.sql(
        "SELECT id FROM runs WHERE job_type = 'report' AND status = 'queued' ORDER BY id LIMIT 1"
    )
    assert isinstance(run_id, int)
    chrome.get(console.url + "/runs?type=report")
    assert status_of(chrome, run_id) == "queued"
    chrome.execute_script("window.pgtickTestMarker = 'same page';")
    time.sleep(1.5)  # a poll or two in
    assert chrome.find_element(By.ID, "live-state").text == "live"

    for new_status in ("cancelled", "queued"):
        console.sql(
            f"UPDATE runs SET status = '{new_status}', updated_at = now(),"
            f" finished_at = {'now()' if new_status == 'cancelled' else 'NULL'}"
            f" WHERE id = {run_id} RETURNING id"
        )
        changed = time.monotonic()
        while status_of(chrome, run_id) != new_status:
            assert time.monotonic() - changed < SEEN_WITHIN_SECONDS + 3, "never shown"
            time.sleep(0.05)
        seen = time.monotonic() - changed
        assert seen <= SEEN_WITHIN_SECONDS, f"{new_status} shown after {seen:.2f}s"
        # the same document: no reload, no navigation
        assert chrome.execute_script("return window.pgtickTestMarker") == "same page"
    # a new run shows up at the top too
    [(new_id,)] = console.sql("INSERT INTO runs (job_type) VALUES ('report') RETURNING id")
    assert isinstance(new_id, int)
    changed = time.monotonic()
    while status_of(chrome, new_id) != "queued":
        assert time.monotonic() - changed < SEEN_WITHIN_SECONDS + 3, "new run never shown"
        time.sleep(0.05)
    assert chrome.execute_script("return window.pgtickTestMarker") == "same page"
    chrome.save_screenshot(str(tmp_path / "runs-live.png"))


def test_every_page_renders_with_scripts_disabled(
    console: Console, no_scripts: Any, tmp_path: Path
) -> None:
    for path, title, marker in (
        ("/", "Overview", "#job-types"),
        ("/runs", "Runs", "#runs"),
        ("/runs?status=dead", "Runs", "#runs"),
        (f"/runs/{console.dead_id}", f"Run {console.dead_id}", "#run-fields"),
        ("/schedules", "Schedules", ".cards"),
        ("/login", "Log in", "form#login"),
    ):
        no_scripts.get(console.url + path)
        assert no_scripts.title == f"{title} · pgtick", path
        assert no_scripts.find_element(By.CSS_SELECTOR, marker).is_displayed(), path
        assert no_scripts.find_element(By.TAG_NAME, "footer").text.startswith("pgtick "), path
        # the script did not run: nothing says "live"
        assert not no_scripts.find_elements(By.CSS_SELECTOR, "#live-state:not(:empty)"), path
        no_scripts.save_screenshot(str(tmp_path / f"{title.replace(' ', '-')}.png"))
    # the overview still reloads itself, as before there was a script
    no_scripts.get(console.url + "/")
    refresh = no_scripts.find_element(By.CSS_SELECTOR, 'meta[http-equiv="refresh"]')
    assert refresh.get_attribute("content") == "5"
