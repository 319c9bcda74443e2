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
from .test_console import cells, log_in


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


def test_the_job_type_page_charts_24_hours_and_7_days_from_the_rollups(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    """Issue 46: throughput and failures over 24 hours and 7 days, from the rollups the
    daemon keeps (it rolls up the prepared history at its start): 5 succeeded runs of a
    minute each, 2 dead, and the hostile dead run's 2 failed attempts."""
    chrome.get(console.url + "/types/report")

    def totals(d: Any) -> dict[str, list[str]] | None:
        rows = {r[0]: r[1:] for r in cells(d, "#history-totals tbody tr")}
        return rows if rows.get("Last 7 days", [""])[0] == "5" else None

    # The page's live region updates itself every 2 s: the figures appear once rolled up.
    rows = WebDriverWait(chrome, 60).until(totals)
    # succeeded, failed attempts, lost attempts, dead, cancelled, mean run time
    assert rows == {
        "Last 24 hours": ["5", "2", "0", "2", "0", "1m 0s"],
        "Last 7 days": ["5", "2", "0", "2", "0", "1m 0s"],
    }
    for key, midnights in (("24h", (0, 1)), ("7d", (6, 7))):
        svg = chrome.find_element(By.ID, f"chart-{key}")
        label = svg.get_attribute("aria-label")
        assert label.endswith(": 5 succeeded, 2 attempts failed or lost, 2 dead"), label
        assert svg.find_elements(By.CSS_SELECTOR, "rect.bar")  # the hours with successes
        assert svg.find_elements(By.CSS_SELECTOR, "rect.failures")
        # a bar per hour, a dashed line at each UTC midnight within the window
        assert len(svg.find_elements(By.CSS_SELECTOR, "line.day")) in midnights
    assert "rolled up to" in chrome.find_element(By.ID, "rolled-up").text
    # The same from the HTTP answer alone (no script): the page is rendered on the server.
    status, body = console.get("/types/report")
    assert status == 200 and 'id="chart-7d"' in body and '<td class="num dead">2</td>' in body
    chrome.save_screenshot(str(tmp_path / "history.png"))
    # The overview's rows give each job type's last 24 hours from the same rollups.
    chrome.get(console.url + "/")
    [row] = cells(chrome, 'tr[data-job-type="report"]')
    assert (row[11], row[12]) == ("5", "2"), row
    assert cells(chrome, 'tr[data-job-type="pickup"]')[0][11:] == ["0", "0"]


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


def _submit(chrome: Any, selector: str) -> str:
    """Submit a form of the page; the flash of the page it lands on."""
    old = chrome.find_element(By.TAG_NAME, "html")
    chrome.find_element(By.CSS_SELECTOR, f"{selector} button").click()
    WebDriverWait(chrome, 20).until(lambda d: d.find_element(By.TAG_NAME, "html") != old)
    WebDriverWait(chrome, 20).until(lambda d: d.find_elements(By.ID, "flash"))
    return str(chrome.find_element(By.ID, "flash").text)


def test_an_operator_controls_the_job_type_and_the_audit_log_names_them(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    """Issue 46, Must show 3 (second half): pause, limits, resume, a bulk retry and a run's
    retry from the console, each in the audit log under the name the operator logged in
    with."""
    log_in(chrome, console.url, TOKEN, name="Olga Operator")
    chrome.get(console.url + "/types/report")
    chrome.find_element(By.CSS_SELECTOR, "form.action-pause-type input[name=reason]").send_keys(
        "smtp is down"
    )
    assert _submit(chrome, "form.action-pause-type") == "paused report on every daemon"
    state = chrome.find_element(By.ID, "pause-state").text
    assert "by Olga Operator: smtp is down" in state, state

    form = chrome.find_element(By.ID, "limits-form")
    form.find_element(By.NAME, "max_running").send_keys("2")
    form.find_element(By.NAME, "rate").send_keys("10/minute")
    assert _submit(chrome, "#limits-form").startswith("limits of report changed")
    limits = {r[0]: r[1:] for r in cells(chrome, "#limits-table tbody tr")}
    assert limits == {"max_running": ["2", "runtime"], "rate": ["10/minute", "runtime"]}
    assert "by Olga Operator" in chrome.find_element(By.ID, "limits-changed").text
    chrome.save_screenshot(str(tmp_path / "controlled.png"))
    keep_screenshot(tmp_path / "controlled.png", "console-job-type.png")
    chrome.get(console.url + "/")
    [row] = cells(chrome, 'tr[data-job-type="report"]')
    assert row[0] == "report paused" and "max_running 2 (runtime)" in row[9]

    chrome.get(console.url + "/types/report")
    assert _submit(chrome, "form.action-reset-limits") == "limits of report back to the config's"
    assert _submit(chrome, "form.action-resume-type") == "resumed report"
    # a bad limit is refused, naming the field
    status, _, body = console.post(
        "/actions/limits",
        {"job_type": "report", "max_running": "0", "csrf": "x"},
        {"Authorization": f"Bearer {TOKEN}"},
    )
    assert status == 400 and "max_running" in body

    chrome.find_element(By.ID, "retry-dead").click()
    WebDriverWait(chrome, 10).until(lambda d: d.find_elements(By.ID, "bulk-count"))
    assert chrome.find_element(By.ID, "bulk-count").get_attribute("data-count") == "2"
    assert _submit(chrome, "form#bulk-confirm") == "retried 2 of the 2 runs confirmed"

    rows = console.sql(
        "SELECT actor, via, action, target, runs_affected FROM audit_log ORDER BY id"
    )
    assert [r[:4] for r in rows] == [
        ("Olga Operator", "console", "pause", "report"),
        ("Olga Operator", "console", "limits", "report"),
        ("Olga Operator", "console", "limits_reset", "report"),
        ("Olga Operator", "console", "resume", "report"),
        ("Olga Operator", "console", "retry", "report"),
    ]
    assert rows[-1][4] == 2
    [(reason,)] = console.sql("SELECT args->>'reason' FROM audit_log WHERE action = 'pause'")
    assert reason == "smtp is down"


def test_the_controls_show_only_to_an_operator(console: Console) -> None:
    # a viewer's page: tests/browser/test_console_roles.py
    cookie = {"Cookie": f"pgtick_session={console.login()}"}  # an operator: forms shown
    assert "/actions/pause-type" in console.get("/types/report", cookie)[1]
    assert "/actions/pause-type" not in console.get("/types/report")[1]  # not logged in
