"""Issue 46, Must show 1 (the banner): every page opens with exactly the ATTENTION items that
`pgtick status` prints for the same database, state after state: due runs of a type no daemon
handles (with dead runs beside them, which neither counts), an overdue schedule, a stuck run,
and nothing at all. Both come from one function (``operations.status``), and this checks it
through what a person sees and what the command prints."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.common.by import By

from pgtick.config.schema import DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS
from pgtick.surfaces.operations import DEFAULT_HORIZON_THRESHOLD_SECONDS

from ..acceptance.cli import pgtick
from ..acceptance.test_vacuum_health import APPLICATION, held_snapshot
from .conftest import TOKEN, WEB, Console, start_console

PAGES = ("/", "/runs", "/schedules")
MATCH_SECONDS = 10.0  # the banner's read is at most a second old


@pytest.fixture(scope="module")
def console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    # The reaper kept away: the stuck run below stays stuck while the test looks at it.
    yield from start_console(
        pg_admin_dsn,
        template_db,
        tmp_path_factory.mktemp("attention"),
        token=TOKEN,
        settings={"reaper": "1h"},
    )


def status_items(console: Console) -> list[str]:
    """The ATTENTION lines `pgtick status` prints (``  ! item``), in its order."""
    result = pgtick(console.dsn, "status")
    lines = result.out
    assert result.code == (5 if any(line.startswith("  ! ") for line in lines) else 0), lines
    return [line.removeprefix("  ! ") for line in lines if line.startswith("  ! ")]


def banner(chrome: Any) -> list[str]:
    items = [li.text for li in chrome.find_elements(By.CSS_SELECTOR, "#attention li")]
    if items:
        heading = chrome.find_element(By.CSS_SELECTOR, "#attention h2").text
        assert heading == f"ATTENTION ({len(items)})"
    else:
        assert chrome.find_elements(By.ID, "attention") == []
    return items


def same_on_every_page(console: Console, chrome: Any, expected: list[str]) -> None:
    """Each page's banner shows ``status``'s items, as soon as its read is fresh."""
    assert status_items(console) == expected
    for path in PAGES:
        deadline = time.monotonic() + MATCH_SECONDS
        while True:
            chrome.get(console.url + path)
            shown = banner(chrome)
            if shown == expected or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert shown == expected, (path, shown, expected)


def test_banner_shows_what_status_prints(console: Console, chrome: Any, tmp_path: Path) -> None:
    unserved = "3 due run(s) of report and no live daemon handles it"
    # The prepared runs: 3 due of report, which no daemon here handles, and 2 dead ones.
    assert console.sql("SELECT count(*) FROM runs WHERE status = 'dead'") == [(2,)]
    same_on_every_page(console, chrome, [unserved])
    chrome.save_screenshot(str(tmp_path / "unserved.png"))

    # A schedule that should have started a run every minute for an hour and started none
    # (its next_due_at far ahead: this daemon's ticker leaves it alone).
    console.sql(
        "INSERT INTO schedules (name, job_type, cron, created_at, next_due_at) VALUES"
        " ('minutely_orphan', 'report', '* * * * *', now() - interval '1 hour',"
        " '2999-01-01') RETURNING id"
    )
    overdue = "schedule minutely_orphan is overdue"
    same_on_every_page(console, chrome, [overdue, unserved])

    # A run whose daemon vanished with it: running on an expired lease.
    console.sql(
        "INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, started_at)"
        " VALUES ('record', 'running', 1, 'gone:1:aa', now() - interval '1 hour',"
        " now() - interval '2 hours') RETURNING id"
    )
    stuck = "1 stuck run(s) of record (running with an expired lease)"
    same_on_every_page(console, chrome, [stuck, overdue, unserved])
    chrome.save_screenshot(str(tmp_path / "three.png"))

    # Each cleared: the banner goes with the last item.
    console.sql("DELETE FROM runs WHERE locked_by = 'gone:1:aa' RETURNING id")
    same_on_every_page(console, chrome, [overdue, unserved])
    console.sql("UPDATE schedules SET paused = true WHERE name = 'minutely_orphan' RETURNING id")
    console.sql("DELETE FROM runs WHERE job_type = 'report' AND status = 'queued' RETURNING id")
    same_on_every_page(console, chrome, [])


HORIZON_THRESHOLD = "2s"
# A holder's age ticks between `status`'s read and the banner's: compared without it.
AGE = re.compile(r"holds the MVCC horizon for \d+s")


@pytest.fixture(scope="module")
def held_console(
    pg_admin_dsn: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    """A console whose banner judges the horizon as `status --horizon-threshold 2s` does."""
    web = WEB.replace("[web]\n", f'[web]\nhorizon_threshold = "{HORIZON_THRESHOLD}"\n', 1)
    yield from start_console(
        pg_admin_dsn, template_db, tmp_path_factory.mktemp("held"), token=TOKEN, web=web
    )


def test_banner_shows_a_held_horizon_as_status_does(
    held_console: Console, chrome: Any, tmp_path: Path
) -> None:
    """Issue 46, Must show 1 (a held horizon): a session holding an old snapshot is an item
    of both, by the one rule (operations.status, Horizon.problem) and the same threshold
    (web.horizon_threshold as --horizon-threshold; both default to the alert's 15 min)."""
    assert DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS == DEFAULT_HORIZON_THRESHOLD_SECONDS
    unserved = "3 due run(s) of report and no live daemon handles it"

    def status_now() -> list[str]:
        result = pgtick(
            held_console.dsn, "status", "--json", "--horizon-threshold", HORIZON_THRESHOLD
        )
        return [
            AGE.sub("holds the MVCC horizon", p)
            for p in json.loads("\n".join(result.out))["problems"]
        ]

    def banner_now(path: str = "/") -> list[str]:
        chrome.get(held_console.url + path)
        return [AGE.sub("holds the MVCC horizon", item) for item in banner(chrome)]

    assert status_now() == [unserved]
    with held_snapshot(held_console.dsn) as pid:
        time.sleep(3)  # past the threshold
        expected = status_now()
        assert len(expected) == 2 and unserved in expected, expected
        [held] = [p for p in expected if p != unserved]
        assert held.startswith(f"session pid {pid} (") and f"application '{APPLICATION}'" in held
        for path in (*PAGES, "/types/report"):
            assert banner_now(path) == expected, path
        chrome.save_screenshot(str(tmp_path / "held.png"))
    deadline = time.monotonic() + MATCH_SECONDS
    while banner_now() != [unserved] and time.monotonic() < deadline:
        time.sleep(0.3)
    assert banner_now() == status_now() == [unserved]
