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
