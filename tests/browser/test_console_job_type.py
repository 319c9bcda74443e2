"""Issue 46: a page per job type, reached from the overview: its queue counts (the overview's
row), the runs it is running and those waiting, its schedules; for an operator its controls
(tests below). A name no job type can have is 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from .conftest import TOKEN, Console, keep_screenshot, start_console
from .test_console import cells


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("job-type"), token=TOKEN
    )


def test_the_job_type_page_shows_its_queue_runs_and_schedules(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    chrome.get(console.url + "/")
    chrome.find_element(By.CSS_SELECTOR, 'tr[data-job-type="report"] a').click()
    WebDriverWait(chrome, 10).until(lambda d: d.current_url == console.url + "/types/report")
    assert chrome.title == "Job type report · pgtick"
    [row] = cells(chrome, "#job-type tbody tr")
    # due, oldest, scheduled, running, stuck, awaiting retry, dead 24 h, live daemons
    assert (row[0], row[2], row[3], row[4], row[5], row[6], row[7]) == (
        "3", "0", "0", "0", "1", "2", "0",
    )  # fmt: skip
    waiting = cells(chrome, "#waiting tbody tr")
    assert len(waiting) == 4 and {r[1] for r in waiting} == {"queued", "failed"}
    assert cells(chrome, "#running tbody tr") == [["Nothing running."]]
    assert cells(chrome, "#type-schedules tbody tr") == [["No schedules of this job type."]]
    chrome.save_screenshot(str(tmp_path / "report.png"))
    keep_screenshot(tmp_path / "report.png", "console-job-type.png")

    chrome.get(console.url + "/types/record")
    schedules = {r[0]: r for r in cells(chrome, "#type-schedules tbody tr")}
    assert set(schedules) == {"nightly_report", "hourly_sync"}
    assert schedules["nightly_report"][2] == "at 03:00 on 1 January, Europe/Amsterdam"
    assert schedules["hourly_sync"][3].startswith("in ")
    [row] = cells(chrome, "#job-type tbody tr")
    assert row[7] == "1"  # this daemon handles record, though no run of it is queued


def test_a_name_no_job_type_can_have_is_404(console: Console) -> None:
    assert console.get("/types/has%20space")[0] == 404
    assert console.get("/types/" + "x" * 300)[0] == 404
    assert console.get("/types/report")[0] == 200


def test_the_overview_lists_every_job_type_a_live_daemon_handles(
    console: Console, chrome: Any
) -> None:
    chrome.get(console.url + "/")
    rows = {r[0]: r for r in cells(chrome, "#job-types tbody tr")}
    # report has runs and no daemon; the daemon's own types are there with no run at all
    assert rows["report"][1] == "3" and rows["report"][8] == "0"
    assert {"record", "pickup", "boom"} <= set(rows)
    assert (rows["pickup"][1], rows["pickup"][7], rows["pickup"][8]) == ("0", "0", "1")
