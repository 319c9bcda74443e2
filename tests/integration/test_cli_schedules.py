"""`pgtick schedules ...`, `pgtick check` and `pgtick run` as real processes: what a user sees
(exit code, one stderr line, stdout) and what the database holds afterwards. An integration
test: the schedules are set up the way the daemon does it (the store's sync, one tick of the
ticker) and `schedules next` is compared with the ticker's own plan()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pgtick.config import load_config
from pgtick.core import ticker
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import RunStore, ScheduleRow
from tests.acceptance.cli import Result

UNREACHABLE_DSN = "postgresql://nobody@127.0.0.1:1/none"
CLI_TIMEOUT_SECONDS = 60.0

JOB_TYPE = """
[metrics]
listen = ""

[logging]
format = "json"

[job_types.noop]
command = ["/bin/true"]
"""


def start(argv: Sequence[str], dsn: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgtick", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PGTICK_DSN": dsn},
    )


def finish(proc: subprocess.Popen[str]) -> Result:
    out, err = proc.communicate(timeout=CLI_TIMEOUT_SECONDS)
    return Result(proc.returncode, out.splitlines(), [line for line in err.splitlines() if line])


def pgtick(dsn: str, *argv: str) -> Result:
    return finish(start(argv, dsn))


def pgtick_all(dsn: str, *argvs: Sequence[str]) -> list[Result]:
    """Several independent commands at once: each is mostly interpreter start-up."""
    procs = [start(argv, dsn) for argv in argvs]
    return [finish(proc) for proc in procs]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- Must show 7: bad schedules are refused by check and by run ----------------------------------

BAD_SCHEDULES = {
    "bad_cron": ('job_type = "noop"\ncron = "61 * * * *"', "cron"),
    "mars": ('job_type = "noop"\ncron = "0 3 * * *"\ntimezone = "Mars/Olympus"', "timezone"),
    "no_such_type": ('job_type = "nope"\ncron = "0 3 * * *"', "job_type"),
    "seconds": ('job_type = "noop"\ncron = "0 0 * * * *"', "cron"),
    "at_boot": ('job_type = "noop"\ncron = "@reboot"', "cron"),
}


def test_bad_schedules_are_refused_by_check_and_run_naming_the_key(
    dsn: str, tmp_path: Path
) -> None:
    """Must show 7: exit 2 and exactly one stderr line naming schedules.NAME.KEY, no traceback."""
    commands: list[tuple[str, str, list[str]]] = []
    for name, (lines, key) in BAD_SCHEDULES.items():
        config = write(tmp_path / f"{name}.toml", f"{JOB_TYPE}\n[schedules.{name}]\n{lines}\n")
        for verb in ("check", "run"):
            commands.append((f"schedules.{name}.{key}", verb, [verb, "--config", str(config)]))
    results = pgtick_all(dsn, *(argv for _, _, argv in commands))
    for (key, verb, _), result in zip(commands, results, strict=True):
        assert result.code == 2, (verb, key, result)
        assert key in result.error, (verb, result.error)
        assert result.error.startswith("pgtick: "), result.error
        if verb == "check":
            assert not any("config OK" in line for line in result.out)
    # And the same file with the schedule fixed is accepted: the refusal was about that key.
    good = write(tmp_path / "good.toml", f'{JOB_TYPE}\n[schedules.ok]\njob_type = "noop"\n'
                 'cron = "0 3 * * *"\ntimezone = "Europe/Amsterdam"\n')  # fmt: skip
    assert pgtick(dsn, "check", "--config", str(good)).code == 0


# --- Must show 6: `schedules next` is what the ticker materializes -------------------------------

WEEK_START = datetime(2026, 10, 22, tzinfo=UTC)
WEEK_END = datetime(2026, 10, 29, tzinfo=UTC)  # the clocks go back on 2026-10-25 in Amsterdam
DST_WEEK_CRONS = {"fixed": "30 2 * * *", "half_hourly": "*/30 * * * *", "hourly": "0 * * * *"}
TICK_STEP = timedelta(minutes=10)
LOOKAHEAD = timedelta(seconds=60)
TICK_SECONDS = 60.0
NEXT_COUNT = 7 * 48 + 10  # more than any of them fires in the week


def materialized_over_the_week(name: str, cron: str) -> list[datetime]:
    """Every scheduled_for the ticker's plan() creates when stepped through the week.

    The database clock starts one lookahead before the week, so every horizon (now + lookahead)
    lands exactly on a :00 or :30: both ends of each window, (cursor, horizon], get exercised.
    """
    created: list[datetime] = []
    cursor, now = WEEK_START, WEEK_START - LOOKAHEAD
    while now <= WEEK_END:
        row = ScheduleRow(
            id=1, name=name, job_type="noop", payload={}, cron=cron, timezone="Europe/Amsterdam",
            max_attempts=None, catchup="latest", catchup_limit=100, overlap="allow",
            jitter_seconds=0.0, materialized_until=cursor, db_now=now,
        )  # fmt: skip
        p = ticker.plan(row, lookahead_seconds=LOOKAHEAD.total_seconds(), tick_seconds=TICK_SECONDS)
        created += [o.scheduled_for for o in p.occurrences]
        cursor, now = p.until, now + TICK_STEP
    return [t for t in created if t <= WEEK_END]


def test_schedules_next_prints_what_the_ticker_materializes_over_a_dst_week(
    tmp_path: Path,
) -> None:
    """Must show 6: the same instants, computed with no database (PGTICK_DSN unreachable)."""
    config = write(
        tmp_path / "week.toml",
        JOB_TYPE
        + "".join(
            f'\n[schedules.{name}]\njob_type = "noop"\ncron = "{cron}"\n'
            'timezone = "Europe/Amsterdam"\n'
            for name, cron in DST_WEEK_CRONS.items()
        ),
    )
    # Start the commands first (mostly interpreter start-up), then step the ticker meanwhile.
    # More occurrences than the week holds: the first beyond it must lie after the week.
    names = list(DST_WEEK_CRONS)
    procs = [
        start(
            ["schedules", "next", name, "--config", str(config),
             "--count", str(NEXT_COUNT), "--from", "2026-10-22T00:00:00Z"],
            UNREACHABLE_DSN,
        )
        for name in names
    ]  # fmt: skip
    expected = {name: materialized_over_the_week(name, DST_WEEK_CRONS[name]) for name in names}
    results = [finish(proc) for proc in procs]

    # The week is the interesting one: a fixed time fires once on the 25th, a cadence twice.
    fall_back = [datetime(2026, 10, 25, h, m, tzinfo=UTC) for h, m in ((0, 0), (0, 30), (1, 0))]
    assert fall_back[1] in expected["fixed"]
    assert fall_back[1] + timedelta(hours=1) not in expected["fixed"]
    assert len(expected["fixed"]) == 7
    assert {fall_back[0], fall_back[2]} <= set(expected["hourly"])
    assert len(expected["hourly"]) == 7 * 24
    assert len(expected["half_hourly"]) == 7 * 48

    for name, result in zip(names, results, strict=True):
        assert (result.code, result.err) == (0, []), (name, result)
        printed = [datetime.fromisoformat(line.split()[0]) for line in result.out]
        assert len(printed) == NEXT_COUNT
        in_week = [t for t in printed if t <= WEEK_END]
        assert in_week == expected[name], name
    fixed_lines = dict(zip(names, results, strict=True))["fixed"].out
    assert "2026-10-25T00:30:00+00:00  2026-10-25 02:30:00 CEST (+02:00)" in fixed_lines
    assert "2026-10-26T01:30:00+00:00  2026-10-26 02:30:00 CET (+01:00)" in fixed_lines


# --- pause / resume / trigger / backfill / list against a real database ---------------------------

SCHEDULES = """
[schedules.nightly]
job_type = "noop"
cron = "30 2 * * *"
timezone = "Europe/Amsterdam"

[schedules.hourly]
job_type = "noop"
cron = "0 * * * *"
"""
# 02:30 in Amsterdam from the 22nd to the 28th of October 2026, across the fall-back night.
BACKFILL_WEEK = [
    "2026-10-22T00:30:00+00:00",
    "2026-10-23T00:30:00+00:00",
    "2026-10-24T00:30:00+00:00",
    "2026-10-25T00:30:00+00:00",
    "2026-10-26T01:30:00+00:00",
    "2026-10-27T01:30:00+00:00",
    "2026-10-28T01:30:00+00:00",
]


def sync(store: RunStore, config: Path) -> None:
    """What `pgtick run` does at start, without starting a daemon."""
    cfg = load_config(config)
    store.sync_schedules([ticker.schedule_def(s) for s in cfg.schedules.values()], ["noop"])


def schedule_state(conn: db.Connection, name: str) -> tuple[bool, str | None, datetime | None]:
    row = conn.execute(
        "SELECT paused, paused_reason, materialized_until FROM schedules WHERE name = %s", (name,)
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def backfilled(conn: db.Connection, name: str) -> list[str]:
    rows = conn.execute(
        "SELECT r.scheduled_for FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = %s AND r.scheduled_for IS NOT NULL ORDER BY 1",
        (name,),
    ).fetchall()
    return [r[0].astimezone(UTC).isoformat() for r in rows]


def db_now(conn: db.Connection) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def test_list_pause_resume_trigger_and_backfill(
    dsn: str, store: RunStore, conn: db.Connection, tmp_path: Path
) -> None:
    config = write(tmp_path / "config.toml", JOB_TYPE + SCHEDULES)
    cfg = ["--config", str(config)]
    assert pgtick(dsn, "schedules", *cfg).out == ["no schedules"]
    sync(store, config)

    table = pgtick(dsn, "schedules", *cfg)
    assert table.code == 0
    header, *lines = table.out
    assert header.split("  ")[0] == "NAME"
    assert [line.split()[0] for line in lines] == ["hourly", "nightly"]
    assert all(" active " in line for line in lines)
    assert "Europe/Amsterdam" in lines[1]
    assert len({line.index("active") for line in table.out[1:]}) == 1  # aligned columns

    # pause: the flag, and the listing says so without a next time
    result = pgtick(dsn, "schedules", "pause", "nightly", *cfg)
    assert (result.code, result.out) == (0, ["paused nightly"])
    assert schedule_state(conn, "nightly")[:2] == (True, "operator")
    assert schedule_state(conn, "hourly")[0] is False
    listed = {
        s["name"]: s for s in json.loads("\n".join(pgtick(dsn, "schedules", "--json", *cfg).out))
    }
    assert listed["nightly"]["state"] == "paused"
    assert listed["nightly"]["next_at"] is None
    assert listed["hourly"]["state"] == "active"
    next_hour = datetime.fromisoformat(listed["hourly"]["next_at"])
    assert next_hour.minute == 0
    assert timedelta(0) < next_hour - db_now(conn) <= timedelta(hours=1)

    # resume continues from now: a cursor left far behind jumps to the database's now
    conn.execute(
        "UPDATE schedules SET materialized_until = now() - interval '3 days' WHERE name = 'nightly'"
    )
    result = pgtick(dsn, "schedules", "resume", "nightly", *cfg)
    assert result.code == 0
    assert result.out == [
        "resumed nightly (continues from now; the paused period is not caught up)"
    ]
    paused, reason, cursor = schedule_state(conn, "nightly")
    assert (paused, reason) == (False, None)
    assert cursor is not None
    assert abs(db_now(conn) - cursor) < timedelta(seconds=30)

    # trigger: an extra run of the schedule, outside its cron
    result = pgtick(dsn, "schedules", "trigger", "nightly", *cfg)
    assert result.code == 0
    run_id = int(result.out[0])
    row = conn.execute(
        "SELECT s.name, r.scheduled_for, r.status, r.job_type FROM runs r "
        "JOIN schedules s ON s.id = r.schedule_id WHERE r.id = %s",
        (run_id,),
    ).fetchone()
    assert row == ("nightly", None, "queued", "noop")

    # backfill: exactly the occurrences in the range, both ends included; idempotent
    window = ["--from", BACKFILL_WEEK[0], "--to", BACKFILL_WEEK[-1]]
    result = pgtick(dsn, "schedules", "backfill", "nightly", *window, *cfg)
    assert (result.code, result.out) == (
        0,
        ["created 7 runs for nightly (0 occurrences already had one)"],
    )
    # overlap = "skip" (the default) holds back the ticker's runs, not backfilled ones: said.
    assert result.err == [
        'pgtick: warning: overlap = "skip" does not hold back backfilled runs: the 7 are due'
        " at once (max_running = 1 on job type 'noop' runs them one at a time)"
    ]
    assert backfilled(conn, "nightly") == BACKFILL_WEEK
    result = pgtick(dsn, "schedules", "backfill", "nightly", *window, *cfg)
    assert result.out == ["created 0 runs for nightly (7 occurrences already had one)"]
    result = pgtick(
        dsn, "schedules", "backfill", "nightly", "--from", "2026-10-27T00:00:00+01:00",
        "--to", "2026-10-29T12:00:00+01:00", *cfg,
    )  # fmt: skip
    assert result.out == ["created 1 runs for nightly (2 occurrences already had one)"]
    assert backfilled(conn, "nightly") == [*BACKFILL_WEEK, "2026-10-29T01:30:00+00:00"]
    assert backfilled(conn, "hourly") == []

    # The latest run is still the one triggered today: the backfilled occurrences are older,
    # though created after it.
    listed = {
        s["name"]: s for s in json.loads("\n".join(pgtick(dsn, "schedules", "--json", *cfg).out))
    }
    assert listed["nightly"]["last_status"] == "queued"
    assert listed["nightly"]["last_scheduled_for"] is None
    assert listed["nightly"]["last_success_at"] is None
    assert set(listed["nightly"]) == {
        "name", "job_type", "cron", "timezone", "state", "paused_reason", "paused_detail",
        "next_at", "last_status", "last_scheduled_for", "last_success_at", "service", "owner",
        "on_pause",
    }  # fmt: skip
    nightly_owner = (listed["nightly"]["owner"], listed["nightly"]["on_pause"])
    assert nightly_owner == ("service default", "hold")
    [nightly] = [line for line in pgtick(dsn, "schedules", *cfg).out if line.startswith("nightly")]
    assert "queued (triggered)" in nightly


def test_unknown_names_exit_4_and_bad_ranges_exit_2(
    dsn: str, store: RunStore, tmp_path: Path
) -> None:
    config = write(tmp_path / "config.toml", JOB_TYPE + SCHEDULES)
    sync(store, config)
    cfg = ["--config", str(config)]
    future = (datetime.now(UTC) + timedelta(days=2)).isoformat()
    results = pgtick_all(
        dsn,
        ["schedules", "pause", "ghost", *cfg],
        ["schedules", "resume", "ghost", *cfg],
        ["schedules", "trigger", "ghost", *cfg],
        ["schedules", "next", "ghost", *cfg],
        ["schedules", "backfill", "ghost", "--from", "2026-10-01", "--to", "2026-10-02", *cfg],
        ["schedules", "backfill", "nightly", "--from", "2026-10-02", "--to", "2026-10-01", *cfg],
        ["schedules", "backfill", "nightly", "--from", "2026-10-01", "--to", future, *cfg],
        ["schedules", "backfill", "hourly", "--from", "2020-01-01", "--to", "2026-10-01", *cfg],
    )
    for result in results[:5]:
        assert result.code == 4, result
        assert "'ghost' not found" in result.error
        assert result.out == []
    assert results[5].code == 2
    assert "--from" in results[5].error
    assert "--to" in results[5].error
    assert results[6].code == 2
    assert results[6].error.startswith("pgtick: --to: ")
    assert results[7].code == 2
    assert "more than 10000 occurrences" in results[7].error
    assert store.list_schedules()[0].last_status is None  # nothing was created


def test_next_looks_up_a_schedule_only_the_database_knows(
    dsn: str, store: RunStore, tmp_path: Path
) -> None:
    sync(store, write(tmp_path / "old.toml", JOB_TYPE + SCHEDULES))
    current = write(tmp_path / "current.toml", JOB_TYPE)  # nightly is gone from this file
    sync(store, current)
    cfg = ["--config", str(current)]
    result = pgtick(
        dsn, "schedules", "next", "nightly", "--from", "2026-10-24T12:00:00Z", "--count", "2", *cfg
    )
    assert (result.code, result.err) == (0, [])
    assert result.out == [
        "2026-10-25T00:30:00+00:00  2026-10-25 02:30:00 CEST (+02:00)",
        "2026-10-26T01:30:00+00:00  2026-10-26 02:30:00 CET (+01:00)",
    ]
    table = pgtick(dsn, "schedules", *cfg).out
    assert all("paused (gone from config)" in line for line in table[1:]), table


def test_the_listing_shows_the_latest_occurrence_after_a_backfill_of_older_ones(
    dsn: str, store: RunStore, conn: db.Connection, tmp_path: Path
) -> None:
    """Issue 9: the last run is the latest scheduled_for, not the newest row."""
    config = write(tmp_path / "config.toml", JOB_TYPE + SCHEDULES)
    cfg = ["--config", str(config)]
    sync(store, config)
    conn.execute(
        "UPDATE schedules SET materialized_until = now() - interval '2 hours', "
        "next_due_at = now() - interval '2 hours' WHERE name = 'hourly'"
    )
    schedules = load_config(config).schedules.values()
    ticker.Ticker(store, list(schedules), ["noop"], load_config(config).ticker,
                  Metrics(["noop"], "test", 1)).tick()  # fmt: skip
    [(live,)] = conn.execute(
        "SELECT r.scheduled_for FROM runs r JOIN schedules s ON s.id = r.schedule_id "
        "WHERE s.name = 'hourly'"
    ).fetchall()
    assert timedelta(0) <= db_now(conn) - live <= timedelta(hours=1)

    start, end = live - timedelta(days=3), live - timedelta(days=2)
    result = pgtick(dsn, "schedules", "backfill", "hourly", "--from", start.isoformat(),
                    "--to", end.isoformat(), *cfg)  # fmt: skip
    assert result.out == ["created 25 runs for hourly (0 occurrences already had one)"]
    listed = {
        s["name"]: s for s in json.loads("\n".join(pgtick(dsn, "schedules", "--json", *cfg).out))
    }
    assert listed["hourly"]["last_scheduled_for"] == live.astimezone(UTC).isoformat()
    assert listed["hourly"]["last_status"] == "queued"
    [hourly] = [line for line in pgtick(dsn, "schedules", *cfg).out if line.startswith("hourly")]
    assert f"queued {live.astimezone(UTC).isoformat()}" in hourly
