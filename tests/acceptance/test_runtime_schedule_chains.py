"""Schedules created at runtime take chains and `after` as a config's do (issue 48, migration
0028): `pgtick schedules add|edit --on-success/--on-dead/--after` and the SQL functions store
them where the config sync would, the audit log names them, an edit can remove them, a call of
the earlier SQL signature still works; and a runtime schedule's occurrence waits after a
config's schedule, runs after it succeeded, and its chain follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dbhelp import Connection

from .cli import pgtick
from .conftest import Cluster, wait_for
from .test_after import _first_billing, _run

REPORT = ("--type", "report", "--cron", "0 3 * * *", "--tz", "Europe/Amsterdam")


def _stored(conn: Connection, name: str) -> tuple[Any, Any]:
    row = conn.execute("SELECT follow, after_on FROM schedules WHERE name = %s", (name,)).fetchone()
    assert row is not None, name
    return row[0], row[1]


def test_add_and_edit_store_chains_and_after_as_the_config_does(conn: Connection, dsn: str) -> None:
    added = pgtick(
        dsn,
        "schedules",
        "add",
        "nightly_report",
        *REPORT,
        "--after",
        "billing",
        "--after-deadline",
        "2h",
        "--after-missed",
        "run",
        "--on-success",
        "mail",
        "--on-dead",
        '{"job_type": "alert", "payload": {"level": 2}}',
    )
    assert added.code == 0, added.err
    follow, after_on = _stored(conn, "nightly_report")
    assert follow == {
        "on_success": [{"job_type": "mail"}],
        "on_dead": [{"job_type": "alert", "payload": {"level": 2}}],
    }
    assert after_on == {"schedule": "billing", "deadline_seconds": 7200.0, "missed": "run"}
    [(what,)] = conn.execute(
        "SELECT args FROM audit_log WHERE action = 'schedule_add' AND target = 'nightly_report'"
    ).fetchall()
    assert what["after"] == after_on and what["follow"] == follow

    # An edit of something else keeps them; '' removes one; the rest stays.
    assert pgtick(dsn, "schedules", "edit", "nightly_report", "--cron", "0 4 * * *").code == 0
    assert _stored(conn, "nightly_report") == (follow, after_on)
    edited = pgtick(dsn, "schedules", "edit", "nightly_report", "--after-missed", "skip")
    assert edited.code == 0, edited.err
    assert _stored(conn, "nightly_report")[1] == {**after_on, "missed": "skip"}
    assert pgtick(dsn, "schedules", "edit", "nightly_report", "--on-success", "").code == 0
    assert pgtick(dsn, "schedules", "edit", "nightly_report", "--after", "").code == 0
    assert _stored(conn, "nightly_report") == ({"on_dead": follow["on_dead"]}, None)

    # Checked as the config file's keys are: one line naming the key, nothing stored.
    bad = pgtick(dsn, "schedules", "add", "other", *REPORT, "--after-missed", "maybe")
    assert bad.code == 2 and len(bad.err) == 1 and "after_missed" in bad.err[0], bad.err
    bad = pgtick(dsn, "schedules", "add", "other", *REPORT, "--on-success", "{not json")
    assert bad.code == 2 and bad.err[0].startswith("pgtick: --on-success: invalid JSON"), bad.err
    assert conn.execute("SELECT count(*) FROM schedules WHERE name = 'other'").fetchone() == (0,)


def test_the_sql_functions_take_them_and_the_earlier_signature_still_works(
    conn: Connection,
) -> None:
    # The earlier (0022) call, by position, fourteen arguments: no chain, no after.
    conn.execute(
        "SELECT create_schedule('plain', 'report', '0 3 * * *', 'UTC', '{}', 'latest', 100,"
        " 'skip', 'hold', 0, NULL, 0, 'app', 'sql')"
    )
    assert _stored(conn, "plain") == (None, None)
    conn.execute(
        "SELECT create_schedule('chained', 'report', '0 3 * * *', follow =>"
        """ '{"on_success": [{"job_type": "mail"}]}', after_on =>"""
        """ '{"schedule": "plain", "deadline_seconds": 60, "missed": "skip"}')"""
    )
    assert _stored(conn, "chained") == (
        {"on_success": [{"job_type": "mail"}]},
        {"schedule": "plain", "deadline_seconds": 60, "missed": "skip"},
    )
    # update_schedule: NULL leaves them, JSON null clears one.
    assert conn.execute("SELECT update_schedule('chained', cron => '0 5 * * *')").fetchone() == (
        True,
    )
    assert _stored(conn, "chained")[0] == {"on_success": [{"job_type": "mail"}]}
    conn.execute("SELECT update_schedule('chained', after_on => 'null')")
    assert _stored(conn, "chained") == ({"on_success": [{"job_type": "mail"}]}, None)


CONFIG = """
[job_types.bill]
handler = "compose_jobs:bill"
max_attempts = 1

[job_types.report]
handler = "compose_jobs:give"

[job_types.mail]
handler = "compose_jobs:callback"

[schedules.billing]
job_type = "bill"
cron = "* * * * *"
payload = { sleep = 8 }
"""


@pytest.mark.timeout(300)
def test_a_runtime_schedule_waits_after_a_configs_and_its_chain_follows(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    Path(str(cluster.jobs_log) + ".mode").write_text("slow")
    added = pgtick(
        dsn,
        "schedules",
        "add",
        "report",
        "--type",
        "report",
        "--cron",
        "* * * * *",
        "--overlap",
        "allow",
        "--after",
        "billing",
        "--after-deadline",
        "50s",
        "--on-success",
        "mail",
    )
    assert added.code == 0, added.err
    cluster.start(cluster.config(CONFIG))
    t1 = wait_for(lambda: _first_billing(conn), 90, interval=0.2, what="a billing run")
    report = wait_for(lambda: _run(conn, "report", t1), 30, what="the report occurrence")
    assert report["status"] == "queued"  # waits while the billing of its period runs
    shown = json.loads(pgtick(dsn, "show", str(report["id"]), "--json").text)
    assert shown["waiting"].startswith(f"after billing: waits for its occurrence {t1.isoformat()}")
    done = wait_for(
        lambda: (r := _run(conn, "report", t1)) and r["status"] == "succeeded" and r, 60
    )
    billing = _run(conn, "billing", t1)
    assert billing is not None and billing["status"] == "succeeded"
    assert done["started_at"] >= billing["finished_at"]
    # Its chain: one mail run, given the report run's id.
    mail = wait_for(
        lambda: [r for r in cluster.records() if r["event"] == "callback"], 30, what="the mail"
    )
    assert len(mail) == 1 and mail[0]["payload"]["previous"]["run_id"] == done["id"], mail
