"""`after` between schedules (issue 48, docs/composition.md): a report schedule after a
billing schedule, both every minute; the billing run slow, then dead. The report's occurrence
waits (queued, its reason in `pgtick show`), runs once the billing of its period succeeded,
and is skipped with the reason when that billing is dead. (The same period across DST:
tests/unit/test_after_period.py.)"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from tests.dbhelp import Connection

from .cli import pgtick as cli
from .conftest import Cluster, wait_for

CONFIG = """
[job_types.bill]
handler = "compose_jobs:bill"
max_attempts = 1

[job_types.report]
handler = "compose_jobs:callback"

[schedules.billing]
job_type = "bill"
cron = "* * * * *"
timezone = "Europe/Amsterdam"
payload = { sleep = 15 }

[schedules.report]
job_type = "report"
cron = "* * * * *"
timezone = "America/New_York"
after = "billing"
after_deadline = "50s"
after_missed = "skip"
overlap = "allow"
"""


def _run(conn: Connection, schedule: str, at: datetime) -> dict[str, object] | None:
    row = conn.execute(
        "SELECT r.id, r.status, r.started_at, r.finished_at, r.last_error FROM runs r"
        " JOIN schedules s ON s.id = r.schedule_id WHERE s.name = %s AND r.scheduled_for = %s",
        (schedule, at),
    ).fetchone()
    if row is None:
        return None
    keys = ("id", "status", "started_at", "finished_at", "last_error")
    return dict(zip(keys, row, strict=True))


def _first_billing(conn: Connection) -> datetime | None:
    row = conn.execute(
        "SELECT r.scheduled_for FROM runs r JOIN schedules s ON s.id = r.schedule_id"
        " WHERE s.name = 'billing' AND r.status = 'running' ORDER BY r.scheduled_for LIMIT 1"
    ).fetchone()
    return None if row is None else row[0]


@pytest.mark.timeout(300)
def test_report_waits_for_the_billing_of_its_period_runs_after_it_and_skips_a_dead_one(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    mode = Path(str(cluster.jobs_log) + ".mode")
    mode.write_text("slow")
    cluster.start(cluster.config(CONFIG))
    t1 = wait_for(lambda: _first_billing(conn), 90, interval=0.2, what="a billing run")
    report1 = wait_for(lambda: _run(conn, "report", t1), 30, what="the report occurrence")
    # Waiting, with its reason, while the billing of its period runs.
    assert report1["status"] == "queued"
    shown = json.loads(cli(dsn, "show", str(report1["id"]), "--json").text)
    assert shown["waiting"].startswith(f"after billing: waits for its occurrence {t1.isoformat()}")
    assert "then skipped" in shown["waiting"]
    mode.write_text("dead")  # the next minute's billing gives up
    done = wait_for(
        lambda: (r := _run(conn, "report", t1)) and r["status"] == "succeeded" and r, 60
    )
    billing1 = _run(conn, "billing", t1)
    assert billing1 is not None and billing1["status"] == "succeeded"
    assert done["started_at"] >= billing1["finished_at"]  # ran after the billing succeeded

    # The next minute: the billing is dead, the report of that period skipped, with why.
    t2 = conn.execute("SELECT %s::timestamptz + interval '1 minute'", (t1,)).fetchone()[0]
    skipped = wait_for(
        lambda: (r := _run(conn, "report", t2)) and r["status"] == "skipped" and r, 90
    )
    assert _run(conn, "billing", t2)["status"] == "dead"  # type: ignore[index]
    assert skipped["last_error"] == (f"after billing: its occurrence {t2.isoformat()} ended dead")
    assert skipped["started_at"] is None
    reports = [r for r in cluster.records() if r["event"] == "callback"]
    assert [r["run_id"] for r in reports] == [done["id"]]
