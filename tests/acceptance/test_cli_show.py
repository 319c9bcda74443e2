"""`pgtick show RUN_ID` as a subprocess: the run, every attempt with its stored error, the
schedule it came from and its effect keys; --json field by field; not found and bad ids."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from psycopg.types.json import Jsonb

from tests.dbhelp import Connection

from .cli import checksum, insert_run, pgtick

T0 = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)  # 03:00 EDT in New York, just after the gap
TRACEBACK = 'Traceback (most recent call last):\n  File "jobs.py", line 3\nValueError: bad row 7'


def _seed(conn: Connection) -> int:
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, timezone)"
        " VALUES ('nightly', 'report', '30 2 * * *', 'America/New_York')"
    )
    (schedule_id,) = conn.execute("SELECT id FROM schedules").fetchone() or (0,)
    run_id = insert_run(
        conn,
        job_type="report",
        schedule_id=schedule_id,
        scheduled_for=T0,
        payload=Jsonb({"day": "2026-03-08"}),
        status="dead",
        attempts=2,
        max_attempts=2,
        run_at=T0 + timedelta(seconds=30),
        started_at=T0 + timedelta(seconds=30),
        finished_at=T0 + timedelta(seconds=31),
        last_error="ValueError: bad row 7",
        error_type="ValueError",
    )
    conn.execute(
        "INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
        " outcome, error, error_type) VALUES"
        " (%(id)s, 1, 'host-a:11:aa', %(t)s, %(t)s + interval '2 seconds', 'failed', %(tb)s,"
        "  'ValueError'),"
        " (%(id)s, 2, 'host-b:22:bb', %(t)s + interval '30 seconds',"
        "  %(t)s + interval '31 seconds', 'failed', 'stderr tail: disk full', 'exit_1')",
        {"id": run_id, "t": T0, "tb": TRACEBACK},
    )
    conn.execute(
        "INSERT INTO effects (key, run_id) VALUES ('mail:42', %(id)s), ('other', NULL)",
        {"id": run_id},
    )
    return run_id


def test_show_a_run_with_attempts_schedule_and_effects(conn: Connection, dsn: str) -> None:
    run_id = _seed(conn)
    result = pgtick(dsn, "show", str(run_id), "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.text)
    assert doc["id"] == run_id
    assert doc["job_type"] == "report"
    assert doc["status"] == "dead"
    assert doc["payload"] == {"day": "2026-03-08"}
    assert (doc["attempts"], doc["max_attempts"]) == (2, 2)
    assert doc["scheduled_for"] == "2026-03-08T07:00:00+00:00"
    assert doc["finished_at"] == "2026-03-08T07:00:31+00:00"
    assert (doc["last_error"], doc["error_type"]) == ("ValueError: bad row 7", "ValueError")
    assert doc["locked_by"] is None
    assert doc["schedule"] == {
        "name": "nightly",
        "cron": "30 2 * * *",
        "timezone": "America/New_York",
        "scheduled_for_local": "2026-03-08 03:00:00 EDT (-04:00)",
    }
    first, second = doc["attempt_history"]
    assert first == {
        "attempt": 1,
        "worker": "host-a:11:aa",
        "started_at": "2026-03-08T07:00:00+00:00",
        "finished_at": "2026-03-08T07:00:02+00:00",
        "duration_seconds": 2.0,
        "outcome": "failed",
        "error_type": "ValueError",
        "error": TRACEBACK,
        "result": None,
    }
    assert (second["worker"], second["error"]) == ("host-b:22:bb", "stderr tail: disk full")
    assert [e["key"] for e in doc["effects"]] == ["mail:42"]

    text = pgtick(dsn, "show", str(run_id))
    assert text.code == 0, text.err
    assert text.out[0] == f"run {run_id}: report, dead, attempt 2/2"
    assert "      ValueError: bad row 7" in text.out  # the traceback, indented, in full
    assert any(line.startswith("  #2 failed on host-b:22:bb") for line in text.out)
    assert any("nightly (30 2 * * *, America/New_York)" in line for line in text.out)
    assert "  mail:42" in " ".join(text.out)


def test_show_refuses_unknown_and_bad_ids(conn: Connection, dsn: str) -> None:
    before = checksum(conn)
    missing = pgtick(dsn, "show", "999999")
    assert missing.code == 4 and missing.error == "pgtick: run 999999 not found"
    for bad in ("-1", "0", "abc", "1.5"):
        result = pgtick(dsn, "show", bad)
        assert result.code == 2, (bad, result)
        assert "run id" in result.error, result.error
    assert checksum(conn) == before


def test_an_attempt_ended_by_a_cancel_reads_as_cancelled_not_lost(
    conn: Connection, dsn: str
) -> None:
    """Issue 44, item 9: an operator-cancelled attempt read "lost ... cancelled by operator"."""
    run_id = insert_run(conn, job_type="export", status="cancelled", attempts=1)
    conn.execute(
        "INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
        " outcome, error) VALUES (%s, 1, 'w-1', now() - interval '1 minute', now(), 'lost',"
        " 'cancelled by operator')",
        (run_id,),
    )
    shown = pgtick(dsn, "show", str(run_id))
    assert shown.code == 0, shown.err
    assert "#1 cancelled by an operator on w-1" in shown.text
    assert "lost" not in shown.text
