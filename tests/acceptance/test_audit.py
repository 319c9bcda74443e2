"""The audit log (issue 45, Must show 4): every operator action — pause, resume, limits,
schedules add/edit/remove, retry, cancel, trigger, prune — appears in `pgtick audit` with who
(the OS user and host of the CLI, the database role) and what (the action, its target, its
arguments, the runs it affected); the operators' SQL functions record their caller too; and
retention deletes old entries."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from pgtick.storage.db import make_pool
from pgtick.storage.store import RunStore
from tests.acceptance.cli import insert_run, pgtick
from tests.dbhelp import Connection


def _ok(dsn: str, *argv: str) -> list[str]:
    done = pgtick(dsn, *argv)
    assert done.code == 0, (argv, done.err)
    return done.out


def _entries(dsn: str) -> list[dict[str, Any]]:
    return list(reversed(json.loads("\n".join(_ok(dsn, "audit", "--json")))))


def test_every_operator_action_is_in_the_audit_log_with_who_and_what(
    conn: Connection, dsn: str
) -> None:
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    role = conn.execute("SELECT current_user").fetchone()
    assert role is not None
    dead = insert_run(conn, job_type="work", status="dead", finished_at="2026-01-01T00:00Z")
    queued = insert_run(conn, job_type="work", status="queued")
    bulk = [insert_run(conn, job_type="bulk", status="dead") for _ in range(3)]
    old = insert_run(conn, job_type="work", status="succeeded", finished_at="2020-01-01T00:00Z")
    conn.execute(
        "INSERT INTO schedules (name, job_type, cron, materialized_until)"
        " VALUES ('nightly', 'work', '0 3 * * *', now())"
    )

    _ok(dsn, "pause", "work", "--reason", "provider down")
    _ok(dsn, "resume", "work")
    _ok(dsn, "limits", "work", "--max-running", "2", "--rate", "10/second")
    _ok(dsn, "limits", "work", "--reset")
    _ok(dsn, "retry", str(dead))
    _ok(dsn, "cancel", str(queued))
    _ok(dsn, "retry", "--status", "dead", "--type", "bulk", "--yes")
    [triggered] = _ok(dsn, "schedules", "trigger", "nightly")
    _ok(dsn, "schedules", "pause", "nightly")
    _ok(dsn, "schedules", "resume", "nightly")
    _ok(dsn, "prune", "--older-than", "365d", "--status", "succeeded")
    _ok(
        dsn,
        "schedules",
        "add",
        "tenant_7",
        "--type",
        "work",
        "--cron",
        "0 9 * * *",
        "--tz",
        "Asia/Tokyo",
    )
    _ok(dsn, "schedules", "edit", "tenant_7", "--cron", "0 10 * * *")
    _ok(dsn, "schedules", "remove", "tenant_7")
    conn.execute("SELECT pause_job_type('reports', 'from the app')")

    entries = _entries(dsn)
    actions = [(e["action"], e["target"]) for e in entries]
    assert actions == [
        ("pause", "work"),
        ("resume", "work"),
        ("limits", "work"),
        ("limits_reset", "work"),
        ("retry", None),
        ("cancel", None),
        ("retry", "bulk"),
        ("trigger", "nightly"),
        ("schedule_pause", "nightly"),
        ("schedule_resume", "nightly"),
        ("prune", None),
        ("schedule_add", "tenant_7"),
        ("schedule_edit", "tenant_7"),
        ("schedule_remove", "tenant_7"),
        ("pause", "reports"),
    ], actions
    for e in entries[:-1]:
        assert (e["actor"], e["via"], e["db_role"]) == (me, "cli", role[0]), e
    by_action = {(e["action"], e["target"]): e for e in entries}
    assert by_action[("pause", "work")]["args"]["reason"] == "provider down"
    assert by_action[("limits", "work")]["args"] == {
        "max_running": 2,
        "rate": 10,
        "rate_window": 1.0,
    }
    assert by_action[("retry", None)]["run_ids"] == [dead]
    assert by_action[("cancel", None)]["run_ids"] == [queued]
    assert sorted(by_action[("retry", "bulk")]["run_ids"]) == bulk
    assert by_action[("retry", "bulk")]["args"]["status"] == "dead"
    assert by_action[("trigger", "nightly")]["run_ids"] == [int(triggered)]
    assert by_action[("prune", None)]["runs_affected"] >= 1
    assert conn.execute("SELECT count(*) FROM runs WHERE id = %s", [old]).fetchone() == (0,)
    assert by_action[("schedule_add", "tenant_7")]["args"]["timezone"] == "Asia/Tokyo"
    assert by_action[("schedule_edit", "tenant_7")]["args"]["cron"] == "0 10 * * *"
    sql_call = by_action[("pause", "reports")]
    assert (sql_call["actor"], sql_call["via"]) == (role[0], "sql")

    text = "\n".join(_ok(dsn, "audit", "--since", "1h"))
    assert "provider down" in text and me[:30] in text and "limits_reset" in text
    assert _ok(dsn, "audit", "--since", "2020-01-01T00:00Z", "--limit", "1")[1:] != []


def test_retention_deletes_audit_entries_older_than_retention_audit(
    conn: Connection, dsn: str
) -> None:
    conn.execute("SELECT record_action('cancel', NULL, '{}', 'old', 'cli')")
    conn.execute("UPDATE audit_log SET at = now() - interval '91 days'")
    conn.execute("SELECT record_action('cancel', NULL, '{}', 'recent', 'cli')")
    store = RunStore(make_pool(dsn, "pgtick", size=1, name="test"))
    try:
        assert store.prune_audit_log(90 * 86400.0) == 1
    finally:
        store.pool.close()
    assert [e["actor"] for e in _entries(dsn)] == ["recent"]
