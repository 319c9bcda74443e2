"""Piped output is never cut (issue 44, item 7): `pgtick runs | grep 'disk full'` found nothing
because LAST ERROR was cut to the 80 columns Python assumes when stdout is no terminal. Without
a terminal and without COLUMNS every value is whole; COLUMNS still sets a width on purpose."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.dbhelp import Connection

from .cli import insert_run

LONG_ERROR = "OSError: could not write the export to /srv/exports/2026/12/01/customers.csv: " * 3
LONG_ERROR += "disk full"
LONG_TYPE = "nightly_customer_export_for_the_finance_team_" + "x" * 40


def _piped(dsn: str, *argv: str, columns: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update({"PGTICK_DSN": dsn, "PGTICK_CONFIG": ""})
    if columns is not None:
        env["COLUMNS"] = columns
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return proc.stdout


def test_piped_runs_keep_the_whole_error_and_job_type(dsn: str, conn: Connection) -> None:
    insert_run(conn, job_type=LONG_TYPE, status="failed", attempts=1, last_error=LONG_ERROR)
    out = _piped(dsn, "runs")
    assert "disk full" in out
    assert LONG_TYPE in out
    assert "…" not in out


def test_columns_still_cuts_on_purpose(dsn: str, conn: Connection) -> None:
    insert_run(conn, job_type="export", status="failed", attempts=1, last_error=LONG_ERROR)
    out = _piped(dsn, "runs", columns="100")
    assert "disk full" not in out
    assert all(len(line) <= 100 for line in out.splitlines())


LONG_SCHEDULE = "nightly_export_of_customers_for_the_finance_team_in_amsterdam"


def _seed_schedules(conn: Connection) -> None:
    """Schedules as an operator names them, one with a run that succeeded."""
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, timezone, materialized_until) VALUES"
        " (%s, %s, '*/15 9-17 * * 1-5', 'America/Argentina/Buenos_Aires', now()),"
        " ('hourly_cleanup', 'cleanup_sessions', '0 * * * *', 'UTC', now())",
        (LONG_SCHEDULE, LONG_TYPE),
    )
    conn.execute(
        "INSERT INTO runs (schedule_id, scheduled_for, job_type, status, attempts, run_at,"
        " started_at, finished_at) SELECT id, now() - interval '1 hour', job_type, 'succeeded',"
        " 1, now() - interval '1 hour', now() - interval '1 hour', now() - interval '59 minutes'"
        " FROM schedules"
    )


def test_schedules_fit_a_terminal(dsn: str, conn: Connection) -> None:
    """`pgtick schedules` was some 170 columns wide (issue 44, item 7)."""
    _seed_schedules(conn)
    out = _piped(dsn, "schedules", columns="100")
    lines = out.splitlines()
    assert len(lines) == 3, out
    assert all(len(line) <= 100 for line in lines), out
    # Names, job types and zones are cut (`--json` has them whole); cron and state never. How
    # much of a name is left depends on the clock: NEXT takes 11 columns when a schedule's next
    # occurrence is another day ("12-03 12:00"), 8 when it is today ("23:00:00").
    assert any(line.startswith("hourly_") and "…" in line for line in lines), out
    assert "*/15 9-17 * * 1-5" in out and "active" in out and "succeeded" in out


def test_piped_schedules_keep_every_value_whole(dsn: str, conn: Connection) -> None:
    _seed_schedules(conn)
    out = _piped(dsn, "schedules")
    assert LONG_SCHEDULE in out and LONG_TYPE in out and "America/Argentina/Buenos_Aires" in out
    assert "…" not in out
    assert "T" in out.splitlines()[1].split()[-1]  # whole ISO 8601 instants, for scripts
