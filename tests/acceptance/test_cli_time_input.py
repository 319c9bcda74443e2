"""Every time option takes an ISO 8601 time (no offset = UTC) or a duration, through one
parser: --run-at, --from, --to, --since, --older-than; --help says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.dbhelp import Connection

from .cli import checksum, pgtick

HELP = {
    ("enqueue",): "--run-at",
    ("schedules", "next"): "--from",
    ("schedules", "backfill"): "--to",
    ("runs",): "--since",
    ("retry",): "--since",
    ("cancel",): "--since",
    ("prune",): "--older-than",
}


@pytest.mark.parametrize("command", list(HELP))
def test_help_says_no_offset_means_utc(dsn: str, command: tuple[str, ...]) -> None:
    result = pgtick(dsn, *command, "--help", env={"COLUMNS": "400"})
    assert result.code == 0
    line = next(line for line in result.out if line.strip().startswith(HELP[command]))
    assert "no offset = UTC" in line and "duration" in line, line


def _run_at(conn: Connection, run_id: str) -> datetime:
    row = conn.execute("SELECT run_at FROM runs WHERE id = %s", (int(run_id),)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_run_at_takes_iso_with_or_without_offset_or_a_duration(conn: Connection, dsn: str) -> None:
    naive = pgtick(dsn, "enqueue", "t", "--run-at", "2026-11-22T09:00:00")
    assert naive.code == 0, naive.err
    assert _run_at(conn, naive.out[0]) == datetime(2026, 11, 22, 9, tzinfo=UTC)
    offset = pgtick(dsn, "enqueue", "t", "--run-at", "2026-11-22T09:00:00+01:00")
    assert _run_at(conn, offset.out[0]) == datetime(2026, 11, 22, 8, tzinfo=UTC)
    ahead = pgtick(dsn, "enqueue", "t", "--run-at", "90m")
    assert ahead.code == 0, ahead.err
    (now,) = conn.execute("SELECT now()").fetchone() or (None,)
    assert now is not None
    delta = _run_at(conn, ahead.out[0]) - now
    assert timedelta(minutes=89) < delta <= timedelta(minutes=90)
    before = checksum(conn)
    bad = pgtick(dsn, "enqueue", "t", "--run-at", "tomorrow")
    assert bad.code == 2
    assert bad.error.startswith("pgtick: --run-at: not an ISO 8601 time or a duration: 'tomorrow'")
    assert checksum(conn) == before


def test_from_and_to_take_durations_back_from_now(conn: Connection, dsn: str) -> None:
    conn.execute("INSERT INTO schedules (name, job_type, cron) VALUES ('daily', 't', '0 12 * * *')")
    result = pgtick(dsn, "schedules", "backfill", "daily", "--from", "3d", "--to", "1d")
    assert result.code == 0, result.err
    made = [
        r[0]
        for r in conn.execute("SELECT scheduled_for FROM runs ORDER BY scheduled_for").fetchall()
    ]
    now = datetime.now(UTC)
    assert len(made) == 2
    assert all(now - timedelta(days=3) <= at <= now - timedelta(days=1) for at in made)
    assert all((at.hour, at.minute) == (12, 0) for at in made)

    nxt = pgtick(dsn, "schedules", "next", "daily", "--from", "36h", "--count", "1")
    assert nxt.code == 0, nxt.err
    first = datetime.fromisoformat(nxt.out[0].split()[0])
    assert now - timedelta(hours=36) < first <= now - timedelta(hours=12)
