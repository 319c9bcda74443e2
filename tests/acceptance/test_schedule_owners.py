"""Schedules owned per service (issue 45, Must show 3): two services with different configs on
one database, sharing a job type: neither's start, restart with a changed config, or restart
without a schedule it had changes the other's schedules; a schedule created at runtime
(`pgtick schedules add`) survives every config sync; a config naming a schedule another owner
has is refused loudly and changes nothing. (pgtick has no in-place reload: a changed config
takes effect at a restart.)"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster, Daemon
from tests.dbhelp import Connection

WORK = '[job_types.work]\nhandler = "flow_jobs:work"\n'


def _service(cluster: Cluster, service: str, schedules: dict[str, str]) -> Path:
    text = WORK
    for name, cron in schedules.items():
        text += f'\n[schedules.{name}]\njob_type = "work"\ncron = "{cron}"\n'
    path = cluster.config(text)
    # worker.service, in the [worker] table the base config opens.
    path.write_text(path.read_text().replace("[worker]\n", f'[worker]\nservice = "{service}"\n'))
    return path


def _rows(conn: Connection) -> dict[str, tuple[Any, ...]]:
    """Each schedule's definition, owner, pause and last change (not the ticker's cursor)."""
    rows = conn.execute(
        "SELECT name, service, job_type, cron, timezone, payload, paused, paused_reason,"
        " updated_at FROM schedules ORDER BY name"
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def _restart(cluster: Cluster, daemon: Daemon, config: Path) -> Daemon:
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0, daemon.log()
    return cluster.start(config)


def _of(rows: dict[str, tuple[Any, ...]], *names: str) -> dict[str, tuple[Any, ...]]:
    return {n: rows[n] for n in names}


def test_two_services_sharing_a_job_type_never_change_each_others_schedules(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    billing = _service(cluster, "billing", {"invoices": "0 3 * * *", "dunning": "0 * * * *"})
    reports = _service(cluster, "reports", {"daily_report": "30 4 * * *"})
    a = cluster.start(billing)
    b = cluster.start(reports)
    rows = _rows(conn)
    assert {n: (r[0], r[5]) for n, r in rows.items()} == {
        "invoices": ("billing", False),
        "dunning": ("billing", False),
        "daily_report": ("reports", False),
    }, rows

    added = pgtick(
        dsn,
        "schedules",
        "add",
        "tenant_42",
        "--type",
        "work",
        "--cron",
        "15 9 * * 1-5",
        "--tz",
        "Europe/Amsterdam",
        "--payload",
        '{"tenant": 42}',
    )
    assert added.code == 0, added.err
    runtime = _rows(conn)["tenant_42"]
    assert runtime[0] is None and runtime[2] == "15 9 * * 1-5" and runtime[3] == "Europe/Amsterdam"
    billing_rows = _of(_rows(conn), "invoices", "dunning")

    # reports restarts with a changed config: its own schedule changes, nothing else does.
    b = _restart(cluster, b, _service(cluster, "reports", {"daily_report": "45 4 * * *"}))
    rows = _rows(conn)
    assert rows["daily_report"][2] == "45 4 * * *"
    assert _of(rows, "invoices", "dunning") == billing_rows
    assert rows["tenant_42"] == runtime

    # reports restarts without its schedule: paused as gone; billing's and the runtime one stay.
    b = _restart(cluster, b, _service(cluster, "reports", {}))
    rows = _rows(conn)
    assert rows["daily_report"][5:7] == (True, "removed")
    assert _of(rows, "invoices", "dunning") == billing_rows
    assert rows["tenant_42"] == runtime
    reports_rows = _of(rows, "daily_report")

    # billing restarts, then restarts with a config that names the runtime schedule too: that
    # name is not its own, so it is left alone, and said so.
    a = _restart(cluster, a, billing)
    rows = _rows(conn)
    assert _of(rows, "invoices", "dunning") == billing_rows
    assert _of(rows, "daily_report") == reports_rows
    assert rows["tenant_42"] == runtime
    a = _restart(
        cluster,
        a,
        _service(
            cluster,
            "billing",
            {"invoices": "0 3 * * *", "dunning": "0 * * * *", "tenant_42": "* * * * *"},
        ),
    )
    rows = _rows(conn)
    assert rows["tenant_42"] == runtime
    assert _of(rows, "invoices", "dunning") == billing_rows
    assert _of(rows, "daily_report") == reports_rows
    assert any(
        e.get("event") == "schedule_owned_elsewhere" and e.get("schedule") == "tenant_42"
        for e in a.events()
    ), a.log()

    # The runtime schedule is edited and removed from the CLI only; a config's is refused.
    edited = pgtick(dsn, "schedules", "edit", "tenant_42", "--cron", "0 10 * * 1-5")
    assert edited.code == 0, edited.err
    assert _rows(conn)["tenant_42"][2] == "0 10 * * 1-5"
    refused = pgtick(dsn, "schedules", "edit", "invoices", "--cron", "0 4 * * *")
    assert refused.code == 2 and "service 'billing'" in refused.error, refused
    assert pgtick(dsn, "schedules", "remove", "tenant_42").code == 0
    assert _rows(conn)["tenant_42"][5:7] == (True, "removed")
    a = _restart(cluster, a, billing)
    assert _rows(conn)["tenant_42"][5:7] == (True, "removed")
    listing = pgtick(dsn, "schedules")
    assert "database" in listing.text and "service billing" in listing.text, listing.text
