"""`pgtick status` as a subprocess: exit 0 when healthy, 5 for stuck runs, an overdue schedule
or due runs no live daemon handles, 3 when the database is unreachable; --json field by field;
the text fits 100 columns. States are prepared with SQL."""

from __future__ import annotations

import json
from pathlib import Path

from tests.dbhelp import Connection

from .cli import TERMINAL_COLUMNS, checksum, insert_run, pgtick

UNREACHABLE_DSN = "postgresql://nobody@127.0.0.1:1/none"


def _worker(conn: Connection, wid: str, job_types: list[str], age: str = "1 second") -> None:
    conn.execute(
        "INSERT INTO workers (id, hostname, pid, version, threads, job_types, heartbeat_at)"
        " VALUES (%s, 'host-' || %s, 4242, '0.1.0', 8, %s, now() - %s::interval)",
        (wid, wid, job_types, age),
    )


def _healthy(conn: Connection) -> None:
    _worker(conn, "w1", ["email", "report"])
    insert_run(conn, job_type="email")  # due now, served by w1
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, timezone, paused, paused_reason,"
        " created_at) VALUES"
        " ('hourly', 'report', '0 * * * *', 'Europe/Amsterdam', false, NULL, now()),"
        " ('held', 'report', '* * * * *', 'UTC', true, 'operator', now() - interval '1 day')"
    )


def _status(dsn: str, *argv: str) -> tuple[int, dict[str, object]]:
    result = pgtick(dsn, "status", "--json", *argv)
    assert result.err == [], result.err
    return result.code, json.loads(result.text)


def test_status_healthy(conn: Connection, dsn: str) -> None:
    _healthy(conn)
    insert_run(conn, job_type="email", status="dead", finished_at="now()")
    code, doc = _status(dsn)
    assert code == 0, doc
    assert doc["healthy"] is True and doc["problems"] == []
    assert doc["stale_after_seconds"] == 60.0  # 3 x the default 20 s heartbeat
    [worker] = doc["workers"]  # type: ignore[misc]
    assert {k: worker[k] for k in ("id", "host", "pid", "version", "threads", "busy")} == {
        "id": "w1",
        "host": "host-w1",
        "pid": 4242,
        "version": "0.1.0",
        "threads": 8,
        "busy": 0,
    }
    assert worker["job_types"] == ["email", "report"] and worker["stale"] is False
    assert 0 <= worker["heartbeat_age_seconds"] < 60
    [email] = doc["job_types"]  # type: ignore[misc]
    assert {k: email[k] for k in email if k != "oldest_due_seconds"} == {
        "job_type": "email",
        "due": 1,
        "scheduled": 0,
        "running": 0,
        "stuck": 0,
        "awaiting_retry": 0,
        "dead_24h": 1,
        "live_workers": 1,
        "unserved": False,
        "limits": None,  # flow control: none configured (tests/acceptance/test_flow_control.py)
        "limit_sources": None,  # nor changed at runtime (pgtick limits)
        "paused": False,
        "waiting_concurrency": 0,
        "waiting_rate": 0,
    }
    held, hourly = doc["schedules"]  # type: ignore[misc]
    assert (held["name"], held["paused"], held["paused_reason"]) == ("held", True, "operator")
    assert held["overdue"] is False and held["next_at"] is None
    assert hourly["name"] == "hourly" and hourly["overdue"] is False
    assert hourly["next_at"].endswith(":00:00+00:00")
    assert hourly["next_at_local"].endswith(("CET (+01:00)", "CEST (+02:00)"))
    assert hourly["last_success_at"] is None

    text = pgtick(dsn, "status")
    assert text.code == 0
    assert text.out[0].endswith(": ok")
    assert all(len(line) <= TERMINAL_COLUMNS for line in text.out), text.out
    assert any("paused (operator)" in line for line in text.out)


def test_status_stuck_run_needs_attention(conn: Connection, dsn: str) -> None:
    _healthy(conn)
    insert_run(
        conn,
        job_type="email",
        status="running",
        attempts=1,
        locked_by="w1",
        locked_until="2020-01-01T00:00:00Z",
        started_at="2020-01-01T00:00:00Z",
    )
    code, doc = _status(dsn)
    assert code == 5
    assert doc["problems"] == ["1 stuck run(s) of email (running with an expired lease)"]
    assert doc["workers"][0]["busy"] == 1  # type: ignore[index]
    text = pgtick(dsn, "status")
    assert text.code == 5 and "ATTENTION (1)" in text.out[0]


def test_status_overdue_schedule_needs_attention(conn: Connection, dsn: str) -> None:
    _healthy(conn)
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, created_at)"
        " VALUES ('minutely', 'report', '* * * * *', now() - interval '1 hour')"
    )
    code, doc = _status(dsn)
    assert code == 5
    assert doc["problems"] == ["schedule minutely is overdue"]
    overdue = {s["name"]: s["overdue"] for s in doc["schedules"]}  # type: ignore[attr-defined]
    assert overdue == {"held": False, "hourly": False, "minutely": True}
    assert any("OVERDUE" in line for line in pgtick(dsn, "status").out)


def test_status_unserved_job_type_needs_attention(
    conn: Connection, dsn: str, tmp_path: Path
) -> None:
    _healthy(conn)
    _worker(conn, "old", ["orphan"], age="10 minutes")  # stale: does not count
    insert_run(conn, job_type="orphan")
    insert_run(conn, job_type="orphan")
    code, doc = _status(dsn)
    assert code == 5
    assert doc["problems"] == ["2 due run(s) of orphan and no live daemon handles it"]
    stale = {w["id"]: w["stale"] for w in doc["workers"]}  # type: ignore[attr-defined]
    assert stale == {"old": True, "w1": False}
    orphan = next(t for t in doc["job_types"] if t["job_type"] == "orphan")  # type: ignore[attr-defined]
    assert orphan["unserved"] is True and orphan["live_workers"] == 0
    text = pgtick(dsn, "status")
    assert any("STALE" in line for line in text.out)
    # A config with a longer heartbeat makes the same worker live again.
    config = tmp_path / "config.toml"
    config.write_text('[worker]\nlease = "1h"\nheartbeat = "5m"\n')
    code, doc = _status(dsn, "--config", str(config))
    assert code == 0, doc["problems"]
    assert doc["stale_after_seconds"] == 900.0


def test_status_database_unreachable(conn: Connection, dsn: str) -> None:
    before = checksum(conn)
    result = pgtick(dsn, "status", "--dsn", UNREACHABLE_DSN)
    assert result.code == 3
    assert result.error.startswith("pgtick: connect:")
    assert checksum(conn) == before
