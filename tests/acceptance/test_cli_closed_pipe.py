"""Every verb handles a closed pipe as Unix tools do (issue 44, item 3): `pgtick runs | head -2`
printed `pgtick: internal error: [Errno 32] Broken pipe` and exited 1. Now nothing is printed
and the status is a SIGPIPE's, 141. The reader here closes its end before the command writes a
byte, so every write the command makes meets the closed pipe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.dbhelp import Connection

from .cli import insert_run

EXIT_PIPE = 141


def _closed_pipe(dsn: str, *argv: str) -> tuple[int, str]:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command starts
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pgtick", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""},
        )
    finally:
        os.close(write)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ("runs",),
        ("runs", "--json"),
        ("show", "{run}"),
        ("logs", "{run}"),
        ("status",),
        ("schedules",),
        ("grants", "pgtick_app"),
    ],
)
def test_a_closed_pipe_ends_the_verb_silently(
    dsn: str, conn: Connection, argv: tuple[str, ...]
) -> None:
    run = insert_run(conn, job_type="mail", status="failed", last_error="disk full", attempts=1)
    conn.execute(
        "INSERT INTO output_chunks (run_id, attempt, attempt_started_at, seq, lines)"
        ' VALUES (%s, 1, now(), 0, \'[[0, "stdout", "hello"]]\')',
        (run,),
    )
    code, err = _closed_pipe(dsn, *(a.replace("{run}", str(run)) for a in argv))
    assert (code, err) == (EXIT_PIPE, "")


def test_help_to_a_closed_pipe_prints_nothing_either(dsn: str) -> None:
    """argparse writes the help itself and ignores the error of its write: 0 then, and no
    message."""
    code, err = _closed_pipe(dsn, "--help")
    assert (code, err) in {(0, ""), (EXIT_PIPE, "")}
