"""Issue 46, Must show 2: a bulk retry of the runs page's filter. 500 dead runs match; the
confirmation page says 500; then 27 more runs of the filter go dead (20 older ones among the
500 by id, 7 new); the confirmed retry retries exactly the 500 and leaves the 27 dead."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from .conftest import TOKEN, Console, start_console
from .test_console import log_in

TYPE = "bulkjob"  # no daemon here handles it: retried runs stay queued


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("bulk"), token=TOKEN
    )


def ids(console: Console, status: str) -> set[int]:
    rows = console.sql(f"SELECT id FROM runs WHERE job_type = '{TYPE}' AND status = '{status}'")
    return {int(r[0]) for r in rows}  # type: ignore[call-overload]


def test_bulk_retry_acts_on_exactly_the_runs_confirmed(
    console: Console, chrome: Any, tmp_path: Path
) -> None:
    # 520 runs, every 26th still queued: 500 dead, and 20 queued ids among theirs
    console.sql(
        f"INSERT INTO runs (job_type, status, attempts, max_attempts, last_error, finished_at)"
        f" SELECT '{TYPE}', CASE WHEN i % 26 = 13 THEN 'queued' ELSE 'dead' END, 3, 3,"
        f" 'boom', CASE WHEN i % 26 = 13 THEN NULL ELSE now() END"
        f" FROM generate_series(1, 520) i RETURNING id"
    )
    confirmed = ids(console, "dead")
    later = ids(console, "queued")
    assert len(confirmed) == 500 and len(later) == 20
    assert min(confirmed) < min(later) < max(later) < max(confirmed)

    log_in(chrome, console.url, TOKEN)
    chrome.get(f"{console.url}/runs?status=dead&type={TYPE}")
    chrome.find_element(By.ID, "bulk-retry").click()
    WebDriverWait(chrome, 10).until(lambda d: d.find_elements(By.ID, "bulk-count"))
    count = chrome.find_element(By.ID, "bulk-count")
    assert count.get_attribute("data-count") == "500"
    assert "500 run(s) will be retried" in count.text
    chrome.save_screenshot(str(tmp_path / "confirm.png"))

    # after the confirmation page: 20 older runs and 7 new ones go dead
    console.sql(
        f"UPDATE runs SET status = 'dead', finished_at = now() WHERE job_type = '{TYPE}'"
        f" AND status = 'queued' RETURNING id"
    )
    console.sql(
        f"INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        f" SELECT '{TYPE}', 'dead', 1, 1, now() FROM generate_series(1, 7) RETURNING id"
    )
    later |= ids(console, "dead") - confirmed
    assert len(later) == 27

    chrome.find_element(By.CSS_SELECTOR, "form#bulk-confirm button").click()
    WebDriverWait(chrome, 20).until(lambda d: d.find_elements(By.ID, "flash"))
    flash = chrome.find_element(By.ID, "flash").text
    assert flash == "retried 500 of the 500 runs confirmed", flash
    assert ids(console, "queued") == confirmed
    assert ids(console, "dead") == later


def test_a_confirmation_whose_count_does_not_match_its_ids_is_refused(console: Console) -> None:
    cookie = {"Cookie": f"pgtick_session={console.login()}"}
    status, page = console.get(f"/bulk?action=retry&status=dead&type={TYPE}", cookie)
    assert status == 200
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None
    before = console.checksum()
    form = {"csrf": found.group(1), "action": "retry", "status": "dead", "type": TYPE}
    for ids_text, count in (("1-3", "2"), ("3-1", "3"), ("x", "1"), ("1-99999999", "99999999")):
        status, _, _ = console.post(
            "/actions/bulk", {**form, "ids": ids_text, "count": count}, cookie
        )
        assert status == 400, (ids_text, status)
    assert console.checksum() == before
