"""The console in headless Chromium against a real daemon with a token: what a person sees on
each page, a filter click, a retry through the form, and hostile data shown as text."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from pgtick.scheduling.cron import Cron

from .conftest import IMG, SCRIPT, TOKEN, Console, keep_screenshot, start_console


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("console"), token=TOKEN
    )


def cells(driver: Any, row_selector: str) -> list[list[str]]:
    rows = driver.find_elements(By.CSS_SELECTOR, row_selector)
    return [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]


def no_alert(driver: Any) -> bool:
    try:
        driver.switch_to.alert  # noqa: B018 - raises when there is none
    except NoAlertPresentException:
        return True
    return False


def test_overview_shows_queues_workers_chart_and_schedules(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    chrome.get(console.url + "/")
    assert chrome.title == "Overview · pgtick"
    [report] = cells(chrome, 'tr[data-job-type="report"]')
    # job type, due, oldest due, scheduled, running, stuck, awaiting retry, dead 24 h, live
    assert report[0] == "report"
    assert (report[1], report[3], report[4], report[5], report[6], report[7]) == (
        "3",
        "0",
        "0",
        "0",
        "1",
        "2",
    )
    assert report[2].startswith("5m "), report  # due five minutes ago
    assert report[8] == "0"  # no live daemon handles report
    workers = cells(chrome, "#workers tbody tr")
    assert len(workers) == 1 and "record" in workers[0][5] and workers[0][6].endswith("ago")
    total = chrome.find_element(By.ID, "throughput-total").text
    assert total == "5 succeeded in the last hour"
    assert len(chrome.find_elements(By.CSS_SELECTOR, "svg#throughput rect.bar")) == 60
    small = chrome.find_element(By.CSS_SELECTOR, 'figure.small-chart[data-job-type="report"]')
    caption = small.find_element(By.TAG_NAME, "figcaption").text
    assert caption == "report: 5 succeeded, 1 dead; 3 waiting now"
    assert len(small.find_elements(By.CSS_SELECTOR, "rect.bar")) == 1  # all in one minute
    assert len(small.find_elements(By.CSS_SELECTOR, "rect.failures")) == 1
    # the queue depth beside them: the 3 runs due (and enqueued) five minutes ago, waiting
    # at every minute since, up to now
    depth = small.find_element(By.CSS_SELECTOR, "svg.depth")
    assert depth.is_displayed() and "waiting, peak 3" in depth.text
    bars = depth.find_elements(By.CSS_SELECTOR, "rect.depth")
    assert 6 <= len(bars) <= 8, len(bars)  # minutes 5..0, and one or two more if slow
    assert len({(b.get_attribute("y"), b.get_attribute("height")) for b in bars}) == 1
    titles = [b.find_element(By.TAG_NAME, "title").get_attribute("textContent") for b in bars]
    assert titles[-1] == "3 due and waiting, this minute" and titles[0].startswith("3 due and")
    assert float(bars[-1].get_attribute("x")) > 200  # the newest minute, at the right end
    schedules = {row[0]: row for row in cells(chrome, "#schedules tbody tr")}
    assert set(schedules) == {"nightly_report", "hourly_sync"}
    assert schedules["nightly_report"][2] == "active"
    # changed by issue 46: scripts on, the page updates itself (live.js, no reload); the
    # reload every 5 s is for browsers without scripts (tests/browser/test_console_live.py)
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in chrome.page_source
    assert chrome.find_element(By.ID, "live-state").text == "live"
    shot = tmp_path / "overview.png"
    chrome.save_screenshot(str(shot))
    keep_screenshot(shot)


def test_runs_filter_by_clicking(console: Console, chrome: Any, tmp_path: Path) -> None:
    chrome.get(console.url + "/runs")
    assert len(cells(chrome, "#runs tbody tr")) == 11  # 3 + 1 + 5 + 2 prepared
    for status in ("failed", "dead"):
        chrome.find_element(By.CSS_SELECTOR, f'input[name="status"][value="{status}"]').click()
    chrome.find_element(By.ID, "apply-filter").click()
    WebDriverWait(chrome, 10).until(lambda d: "status=dead" in d.current_url)
    assert "status=failed" in chrome.current_url and "status=dead" in chrome.current_url
    rows = cells(chrome, "#runs tbody tr")
    assert sorted(r[2] for r in rows) == ["dead", "dead", "failed"]
    assert [int(r[0]) for r in rows] == sorted((int(r[0]) for r in rows), reverse=True)
    chrome.find_element(By.CSS_SELECTOR, 'a.status-link[data-status="succeeded"]').click()
    WebDriverWait(chrome, 10).until(lambda d: "status=succeeded" in d.current_url)
    rows = cells(chrome, "#runs tbody tr")
    assert len(rows) == 5 and {r[2] for r in rows} == {"succeeded"}
    chrome.save_screenshot(str(tmp_path / "runs.png"))


def test_run_detail_renders_hostile_data_as_text(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    chrome.get(f"{console.url}/runs/{console.hostile_id}")
    assert no_alert(chrome)
    # changed by issue 46: the console's own live.js is the one script (its CSP nonce)
    assert chrome.find_elements(By.CSS_SELECTOR, 'script:not([src="/static/live.js"])') == []
    assert chrome.find_elements(By.TAG_NAME, "img") == []
    assert chrome.execute_script("return document.querySelectorAll('[onerror]').length") == 0
    payload = chrome.find_element(By.ID, "payload").text
    assert SCRIPT in payload and IMG.replace('"', '\\"') in payload  # JSON quotes the quote
    assert chrome.find_element(By.ID, "last-error").text == f"bad input {SCRIPT} {IMG}"
    attempts = chrome.find_elements(By.CSS_SELECTOR, "#attempts tr.attempt")
    assert [a.get_attribute("data-attempt") for a in attempts] == ["1", "2"]
    spans = chrome.find_elements(By.CSS_SELECTOR, "svg#timeline rect.span")
    assert [s.get_attribute("data-attempt") for s in spans] == ["1", "2"]
    assert all(s.size["width"] > 0 for s in spans)
    assert all("elsewhere:1:aa" in a.text and "failed" in a.text for a in attempts)
    errors = [e.text for e in chrome.find_elements(By.CSS_SELECTOR, "tr.attempt-error pre")]
    assert errors == [f"Traceback (most recent call last):\n  {SCRIPT}", IMG]
    # Each attempt's output: as text, colour codes gone, the omitted middle marked.
    outputs = chrome.find_elements(By.CSS_SELECTOR, "#output pre.output")
    assert [o.get_attribute("data-attempt") for o in outputs] == ["2"]
    assert outputs[0].text.splitlines() == [
        f"hello {SCRIPT}",
        f"red {IMG}",
        "… 12345 bytes omitted …",
        "INFO job: done",
    ]
    assert len(outputs[0].find_elements(By.CSS_SELECTOR, "span.stderr")) == 1
    assert 'http-equiv="refresh"' not in chrome.page_source
    chrome.save_screenshot(str(tmp_path / "run.png"))
    keep_screenshot(tmp_path / "run.png", "console-run.png")
    # the runs list shows the hostile error too, still as text
    chrome.get(f"{console.url}/runs?status=dead")
    assert no_alert(chrome) and chrome.find_elements(By.TAG_NAME, "img") == []
    assert SCRIPT in chrome.find_element(By.ID, "runs").text


def test_schedules_show_next_times_in_utc_and_local(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    chrome.get(console.url + "/schedules")
    card = chrome.find_element(By.ID, "schedule-nightly_report")
    rows = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in card.find_elements(By.CSS_SELECTOR, "table.upcoming tbody tr")
    ]
    now = console.sql("SELECT now()")[0][0]
    cron = Cron.parse("0 3 1 1 *", "Europe/Amsterdam")
    expected = cron.next_n(now, 5)  # type: ignore[arg-type]
    assert [r[0] for r in rows] == [f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S}" for at in expected]
    assert all(r[1].endswith("03:00:00 CET (+01:00)") for r in rows)
    assert "Europe/Amsterdam" in card.text and "active" in card.text
    chrome.save_screenshot(str(tmp_path / "schedules.png"))


def log_in(chrome: Any, url: str, token: str, name: str = "Olga Operator") -> None:
    """The login page, a name and the token pasted once, the submit: back on the overview,
    logged in."""
    chrome.get(url + "/login")
    chrome.find_element(By.NAME, "name").send_keys(name)
    chrome.find_element(By.NAME, "token").send_keys(token)
    chrome.find_element(By.CSS_SELECTOR, "form#login button").click()
    WebDriverWait(chrome, 10).until(lambda d: d.current_url == url + "/")
    assert chrome.find_element(By.ID, "logout").text == "Log out"


def test_retry_a_dead_run_after_logging_in(console: Console, chrome: Any, tmp_path: Path) -> None:
    # changed by issue 22: the token is pasted once on /login, not typed into every form
    chrome.get(f"{console.url}/runs/{console.dead_id}")
    assert chrome.find_elements(By.CSS_SELECTOR, "form.action-retry") == []
    assert chrome.find_element(By.ID, "login-link").text == "Log in"
    log_in(chrome, console.url, TOKEN)
    chrome.get(f"{console.url}/runs/{console.dead_id}")
    form = chrome.find_element(By.CSS_SELECTOR, "form.action-retry")
    assert form.find_elements(By.NAME, "token") == []
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(chrome, 10).until(lambda d: "?flash=" in d.current_url)
    flash = chrome.find_element(By.ID, "flash").text
    assert flash == f"run {console.dead_id} retried"
    assert chrome.current_url.startswith(f"{console.url}/runs/{console.dead_id}?flash=")
    fields = chrome.find_element(By.ID, "run-fields").text
    assert "Status queued" in fields
    assert console.sql(f"SELECT status FROM runs WHERE id = {console.dead_id}") == [("queued",)]
    assert any(
        e.get("event") == "console_action"
        and e.get("what") == "retry"
        and e.get("ids") == [str(console.dead_id)]
        for e in console.daemon.events()
    )
    chrome.save_screenshot(str(tmp_path / "retried.png"))
    chrome.find_element(By.ID, "logout").click()
    WebDriverWait(chrome, 10).until(lambda d: d.current_url == console.url + "/login")
    assert [c for c in chrome.get_cookies() if c["name"] == "pgtick_session"] == []


def test_wrong_token_and_get_change_nothing(console: Console) -> None:
    before = console.checksum()
    for action, form in (
        ("retry", {"run_id": str(console.hostile_id)}),
        ("cancel", {"run_id": "1"}),
        ("trigger", {"schedule": "nightly_report"}),
        ("pause", {"schedule": "nightly_report"}),
    ):
        status, _, _ = console.post(f"/actions/{action}", {**form, "token": "not-it"})
        assert status == 403, action
        status, _, _ = console.post(f"/actions/{action}", form, {"Authorization": "Bearer not-it"})
        assert status == 403, action
        status, _ = console.get(
            f"/actions/{action}?{'&'.join(f'{k}={v}' for k, v in form.items())}"
        )
        assert status == 405, action
    # the right token, but sent from another site
    status, _, body = console.post(
        "/actions/pause",
        {"schedule": "nightly_report", "token": TOKEN},
        {"Origin": "https://attacker.example", "Sec-Fetch-Site": "cross-site"},
    )
    assert status == 403 and "refused" in body
    assert console.checksum() == before


def test_schedule_and_cancel_actions_with_a_bearer_token(console: Console) -> None:
    time.sleep(1.1)  # a wrong token another test gave from this address holds it back a second
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    status, location, _ = console.post("/actions/pause", {"schedule": "hourly_sync"}, bearer)
    assert (status, location) == (303, "/schedules?flash=paused+hourly_sync")
    assert console.sql("SELECT paused FROM schedules WHERE name = 'hourly_sync'") == [(True,)]
    status, _, _ = console.post("/actions/resume", {"schedule": "hourly_sync"}, bearer)
    assert console.sql("SELECT paused FROM schedules WHERE name = 'hourly_sync'") == [(False,)]
    before = console.sql("SELECT count(*) FROM runs")[0][0]
    status, location, _ = console.post("/actions/trigger", {"schedule": "nightly_report"}, bearer)
    assert status == 303 and "triggered+nightly_report" in location
    assert console.sql("SELECT count(*) FROM runs")[0][0] == before + 1  # type: ignore[operator]
    queued = console.sql("SELECT id FROM runs WHERE job_type = 'report' AND status = 'queued'")
    status, location, _ = console.post("/actions/cancel", {"run_id": str(queued[0][0])}, bearer)
    assert location == f"/runs/{queued[0][0]}?flash=run+{queued[0][0]}+cancelled"
    status, location, _ = console.post("/actions/pause", {"schedule": "nope"}, bearer)
    assert status == 303 and "not+found" in location
    status, _, _ = console.post("/actions/retry", {"run_id": "x1"}, bearer)
    assert status == 400


def test_cron_in_words_relative_times_and_the_error_first(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    """Issue 46: cron strings also in words, times relative with the instant on hover, and a
    run's error and output above the fold (a 1280x1000 window)."""
    chrome.get(console.url + "/schedules")
    words = {
        card.get_attribute("id"): card.find_element(By.CSS_SELECTOR, ".cron-words").text
        for card in chrome.find_elements(By.CSS_SELECTOR, "article.schedule")
    }
    assert words["schedule-nightly_report"] == "at 03:00 on 1 January, Europe/Amsterdam"
    assert words["schedule-hourly_sync"] == "at minute 15 of every hour, UTC"
    chrome.get(console.url + "/")
    schedules = {row[0]: row for row in cells(chrome, "#schedules tbody tr")}
    assert schedules["hourly_sync"][6] == "at minute 15 of every hour, UTC"
    assert schedules["hourly_sync"][3].startswith("in ")  # the next run, from now

    chrome.get(console.url + "/runs?status=succeeded&type=report")
    finished = chrome.find_elements(By.CSS_SELECTOR, "#runs tbody tr td:nth-child(6) time")
    assert finished and all(t.text == "2 min ago" for t in finished), [t.text for t in finished]
    exact = finished[0].get_attribute("title")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", exact), exact
    assert finished[0].get_attribute("datetime").startswith(exact[:10])

    chrome.get(f"{console.url}/runs/{console.hostile_id}")
    height = chrome.execute_script("return window.innerHeight")
    for selector in ("#last-error", "pre.output"):
        top = chrome.execute_script(
            "return document.querySelector(arguments[0]).getBoundingClientRect().top", selector
        )
        assert top < height * 0.6, (selector, top, height)
    order = chrome.execute_script(
        "const e = document.querySelector('#last-error');"
        "const f = document.querySelector('#run-fields');"
        "return !!(e.compareDocumentPosition(f) & Node.DOCUMENT_POSITION_FOLLOWING);"
    )
    assert order  # the error before the row's fields
    chrome.save_screenshot(str(tmp_path / "run-error-first.png"))
