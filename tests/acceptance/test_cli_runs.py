"""`pgtick runs` as a subprocess against a real database: filters, keyset pages, --json field by
field, the table's width, and one-line refusals."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tests.dbhelp import Connection

from .cli import TERMINAL_COLUMNS, insert_run, pgtick

T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _seed(conn: Connection) -> dict[str, int]:
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron) VALUES ('nightly', 'report', '0 3 * * *')"
    )
    (schedule_id,) = conn.execute("SELECT id FROM schedules").fetchone() or (0,)
    ids = {
        "old": insert_run(conn, job_type="email", created_at=datetime.now(UTC) - timedelta(days=3)),
        "dead": insert_run(
            conn,
            job_type="email",
            status="dead",
            attempts=3,
            max_attempts=3,
            run_at=T0,
            started_at=T0 + timedelta(seconds=1),
            finished_at=T0 + timedelta(seconds=3, milliseconds=500),
            last_error="SMTPError: 550 mailbox unavailable\n" + "x" * 300,
            error_type="SMTPError",
        ),
        "report": insert_run(
            conn,
            job_type="report",
            schedule_id=schedule_id,
            scheduled_for=T0,
            status="succeeded",
            attempts=1,
            max_attempts=10,
            run_at=T0,
            started_at=T0,
            finished_at=T0 + timedelta(minutes=3, seconds=5),
        ),
    }
    for i in range(5):
        ids[f"q{i}"] = insert_run(conn, job_type="email")
    return ids


def test_runs_lists_filters_and_pages(conn: Connection, dsn: str) -> None:
    ids = _seed(conn)

    everything = pgtick(dsn, "runs", "--json")
    assert everything.code == 0, everything.err
    doc = json.loads(everything.text)
    listed = [r["id"] for r in doc["runs"]]
    assert listed == sorted(ids.values(), reverse=True)
    assert doc["next_before"] is None
    dead = next(r for r in doc["runs"] if r["id"] == ids["dead"])
    assert dead == {
        "id": ids["dead"],
        "job_type": "email",
        "status": "dead",
        "attempts": 3,
        "max_attempts": 3,
        "schedule": None,
        "run_at": "2026-01-05T12:00:00+00:00",
        "started_at": "2026-01-05T12:00:01+00:00",
        "finished_at": "2026-01-05T12:00:03.500000+00:00",
        "duration_seconds": 2.5,
        "last_error": "SMTPError: 550 mailbox unavailable\n" + "x" * 300,
    }
    report = next(r for r in doc["runs"] if r["id"] == ids["report"])
    assert report["schedule"] == "nightly"
    assert report["duration_seconds"] == 185.0

    # Keyset pages: disjoint, newest first, together everything, the next --before printed.
    seen: list[int] = []
    before: list[str] = []
    for _ in range(10):
        page = pgtick(dsn, "runs", "--limit", "3", *before)
        assert page.code == 0, page.err
        rows = [line for line in page.out[1:] if not line.startswith("more:")]
        seen += [int(line.split()[0]) for line in rows]
        more = [line for line in page.out if line.startswith("more: --before ")]
        if not more:
            break
        assert more == [f"more: --before {seen[-1]}"]
        before = ["--before", more[0].removeprefix("more: --before ")]
    assert seen == listed

    def only(*argv: str) -> list[int]:
        result = pgtick(dsn, "runs", "--json", *argv)
        assert result.code == 0, result.err
        return [r["id"] for r in json.loads(result.text)["runs"]]

    assert only("--status", "dead") == [ids["dead"]]
    assert only("--status", "dead", "--status", "succeeded") == [ids["report"], ids["dead"]]
    assert only("--type", "report") == [ids["report"]]
    assert only("--schedule", "nightly") == [ids["report"]]
    assert only("--schedule", "nosuch") == []
    assert ids["old"] not in only("--since", "1d")
    assert ids["old"] in only("--since", "4d")
    since = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert ids["old"] not in only("--since", since)  # ISO without offset: UTC
    assert only("--before", str(ids["q0"])) == [ids["report"], ids["dead"], ids["old"]]


def test_runs_table_fits_the_terminal(conn: Connection, dsn: str) -> None:
    ids = _seed(conn)
    table = pgtick(dsn, "runs")
    assert table.code == 0, table.err
    assert table.out[0].split()[:3] == ["ID", "JOB", "TYPE"]
    assert all(len(line) <= TERMINAL_COLUMNS for line in table.out), table.out
    dead = next(line for line in table.out if line.startswith(f"{ids['dead']} "))
    assert "dead" in dead and "3/3" in dead
    assert "01-05 12:00" in dead or "2026-01-05" in dead  # ls -l style: this year or not
    assert "2.50s" in dead and "SMTPError: 550" in dead and dead.endswith("…")
    report = next(line for line in table.out if line.startswith(f"{ids['report']} "))
    assert "3m05s" in report
    wide = pgtick(dsn, "runs", "--status", "dead", env={"COLUMNS": "500"})
    assert "x" * 300 in wide.text


def test_runs_refuses_bad_arguments(dsn: str) -> None:
    unknown = pgtick(dsn, "runs", "--status", "dying")
    assert unknown.code == 2
    assert "'dying'" in unknown.error and "queued, running, succeeded" in unknown.error
    for argv in (
        ["--limit", "0"],
        ["--limit", "x"],
        ["--before", "-3"],
        ["--before", "abc"],
        ["--since", "yesterday"],
    ):
        result = pgtick(dsn, "runs", *argv)
        assert result.code == 2, (argv, result)
        assert result.error.startswith("pgtick"), result.error
    empty = pgtick(dsn, "runs")
    assert (empty.code, empty.out) == (0, ["no runs"])
