"""`pgtick prune` as a subprocess: per-status retention from the config, --older-than,
--status, --dry-run counting only; attempts go with their runs; bad input changes nothing."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.dbhelp import Connection

from .cli import checksum, insert_run, pgtick


def _finished(conn: Connection, status: str, days_ago: float, attempts: int = 0) -> int:
    run_id = insert_run(
        conn,
        job_type="email",
        status=status,
        attempts=attempts,
        finished_at=datetime.now(UTC) - timedelta(days=days_ago),
    )
    for n in range(1, attempts + 1):
        conn.execute(
            "INSERT INTO attempts_history (run_id, attempt, worker_id, outcome)"
            " VALUES (%s, %s, 'w', 'failed')",
            (run_id, n),
        )
    return run_id


def _remaining(conn: Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())


def test_prune_per_retention_status_and_dry_run(conn: Connection, dsn: str, tmp_path: Path) -> None:
    for _ in range(3):
        _finished(conn, "succeeded", 10, attempts=2)
    _finished(conn, "succeeded", 1)
    _finished(conn, "dead", 40, attempts=3)
    _finished(conn, "dead", 10)
    _finished(conn, "cancelled", 10)
    _finished(conn, "skipped", 2)
    insert_run(conn, job_type="email")  # queued: never pruned

    before = checksum(conn)
    dry = pgtick(dsn, "prune", "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out == [
        "succeeded  would delete 3 (finished more than 7d ago)",
        "dead       would delete 1 (finished more than 30d ago)",
        "cancelled  would delete 1 (finished more than 7d ago)",
        "skipped    would delete 1 (finished more than 1d ago)",
        "total      would delete 6",
    ]
    assert checksum(conn) == before

    config = tmp_path / "config.toml"
    config.write_text('[retention]\nsucceeded = "12h"\n')
    only = pgtick(dsn, "prune", "--config", str(config), "--status", "succeeded")
    assert only.code == 0, only.err
    assert only.out == ["succeeded  deleted 4 (finished more than 12h ago)", "total      deleted 4"]
    assert _remaining(conn) == {"dead": 2, "cancelled": 1, "skipped": 1, "queued": 1}
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (3,)  # the dead run's

    aged = pgtick(dsn, "prune", "--older-than", "20d")
    assert aged.code == 0, aged.err
    assert aged.out[-1] == "total      deleted 1"
    assert _remaining(conn) == {"dead": 1, "cancelled": 1, "skipped": 1, "queued": 1}
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (0,)


def test_prune_refuses_bad_input(conn: Connection, dsn: str) -> None:
    _finished(conn, "succeeded", 10)
    before = checksum(conn)
    for argv, needle in (
        (["--status", "queued"], "'queued' is not allowed here"),
        (["--status", "gone"], "unknown status 'gone'"),
        (["--older-than", "0s"], "--older-than: must be in the past"),
        (["--older-than", "2999-01-01"], "--older-than: must be in the past"),
        (["--older-than", "soon"], "--older-than: not an ISO 8601 time or a duration"),
    ):
        result = pgtick(dsn, "prune", *argv)
        assert result.code == 2, (argv, result)
        assert needle in result.error, result.error
    assert checksum(conn) == before


PROGRESS_RUNS = 2500  # three batches of the store's 1 000


def _many_finished(conn: Connection, n: int) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at)"
        " SELECT 'email', 'succeeded', now() - interval '10 days' FROM generate_series(1, %s)",
        [n],
    )


def _prune_on_a_terminal(dsn: str) -> tuple[int, str]:
    """`pgtick prune` with stderr on a pseudo-terminal (stdout a pipe): its code and what the
    terminal showed."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pgtick", "prune", "--status", "succeeded"],
            stdout=subprocess.PIPE,
            stderr=follower,
            timeout=60,
            env={**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""},
        )
    finally:
        os.close(follower)
    shown = b""
    while select.select([leader], [], [], 0.5)[0]:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.returncode, shown.decode()


def test_prune_shows_progress_on_a_terminal_and_in_the_log(conn: Connection, dsn: str) -> None:
    """Issue 18: a long prune shows rows done, rate and time left on a terminal (one line
    rewritten in place, ending with the total) and as `progress` log events; a pipe gets none."""
    _many_finished(conn, PROGRESS_RUNS)
    code, shown = _prune_on_a_terminal(dsn)
    assert code == 0, shown
    last = shown.replace("\r\n", "\n").split("\r")[-1].strip().splitlines()[-1]
    assert re.fullmatch(
        r"\x1b\[Kprune succeeded: 2 500 of 2 500 rows \(100%\), [\d ]+ rows/s", last
    ), repr(shown)
    assert _remaining(conn) == {}

    _many_finished(conn, PROGRESS_RUNS)
    piped = pgtick(dsn, "prune", "--status", "succeeded")
    assert piped.code == 0 and piped.err == [], piped
    assert piped.out[-1] == "total      deleted 2500"

    _many_finished(conn, PROGRESS_RUNS)
    logged = pgtick(dsn, "prune", "--status", "succeeded", "--debug")
    assert logged.code == 0, logged
    events = [line for line in logged.err if "progress" in line and "final=True" in line]
    assert len(events) == 1, logged.err
    assert "done=2500" in events[0] and "total=2500" in events[0], events
