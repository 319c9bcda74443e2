"""The documented least-privilege role: created with the SQL `pgtick grants` prints, it runs a
daemon (drains runs, ticks a schedule) and every operator verb; `migrate` as it is refused in
one line with exit 2. The role logs in with a password the server checks."""

from __future__ import annotations

import json
import signal

import psycopg
import pytest

from tests.dbhelp import Connection

from .cli import insert_run, pgtick
from .conftest import Cluster, status_counts, wait_for
from .roles import login_role

SCHEDULE = """
[schedules.every_minute]
job_type = "record"
cron = "* * * * *"
overlap = "allow"  # materialized a lookahead ahead of time
"""


@pytest.mark.timeout(180)
def test_daemon_and_cli_run_as_the_granted_role_and_migrate_is_refused(
    pg_admin_dsn: str, dsn: str, conn: Connection, cluster: Cluster
) -> None:
    with login_role(pg_admin_dsn, dsn) as role:
        printed = pgtick(dsn, "grants", role.name)
        assert printed.code == 0, printed.err
        assert "CREATE" not in printed.text.replace("CREATE ROLE", "")
        with psycopg.connect(dsn, autocommit=True) as owner:
            owner.execute(printed.text.encode())

        # Usage, but no CREATE: the role could not have migrated.
        row = conn.execute(
            "SELECT has_schema_privilege(%s, 'pgtick', 'CREATE'),"
            " has_schema_privilege(%s, 'pgtick', 'USAGE')",
            (role.name, role.name),
        ).fetchone()
        assert row == (False, True)

        daemon = cluster.start(
            cluster.config(SCHEDULE, reaper="1s", poll_interval="1s"),
            env={"PGTICK_DSN": role.dsn},
        )
        ids = [int(pgtick(role.dsn, "enqueue", "record").text) for _ in range(5)]
        wait_for(lambda: status_counts(conn).get("succeeded", 0) >= 5, 30, what="runs drained")
        # The ticker synced the schedule and materialized its next occurrence as the role
        # (two, when the daemon started just before a minute boundary: the early wake then
        # materializes the following one as well).
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) >= 1 FROM runs r JOIN schedules s ON s.id = r.schedule_id"
                    " WHERE s.name = 'every_minute'"
                ).fetchone()
                == (True,)
            ),
            30,
            what="the schedule's next occurrence",
        )

        status = pgtick(role.dsn, "status", "--json")
        assert status.code == 0, (status.out, status.err)
        doc = json.loads(status.text)
        assert [w["pid"] for w in doc["workers"]] == [daemon.pid]
        assert [s["name"] for s in doc["schedules"]] == ["every_minute"]

        runs = pgtick(role.dsn, "runs", "--type", "record", "--status", "succeeded", "--json")
        assert runs.code == 0, runs.err
        # The schedule's occurrence (same job type) may have come due and run too.
        listed = json.loads(runs.text)["runs"]
        assert sorted(r["id"] for r in listed if r["schedule"] is None) == ids
        assert all(r["schedule"] in (None, "every_minute") for r in listed), listed

        shown = pgtick(role.dsn, "show", str(ids[0]), "--json")
        assert shown.code == 0, shown.err
        doc = json.loads(shown.text)
        assert (doc["status"], len(doc["attempt_history"])) == ("succeeded", 1)

        later = int(pgtick(role.dsn, "enqueue", "record", "--in", "1h").text)
        cancelled = pgtick(role.dsn, "cancel", str(later))
        assert cancelled.code == 0, cancelled.err
        retried = pgtick(role.dsn, "retry", str(later))
        assert retried.code == 0, retried.err
        wait_for(
            lambda: (
                conn.execute("SELECT status FROM runs WHERE id = %s", (later,)).fetchone()
                == ("succeeded",)
            ),
            30,
            what="the retried run to succeed",
        )

        old = insert_run(conn, job_type="record", status="dead", finished_at="2020-01-01")
        conn.execute(
            "INSERT INTO attempts_history (run_id, attempt, worker_id, outcome)"
            " VALUES (%s, 1, 'w', 'failed')",
            (old,),
        )
        pruned = pgtick(role.dsn, "prune", "--older-than", "30d", "--status", "dead")
        assert pruned.code == 0, pruned.err
        assert conn.execute(
            "SELECT count(*) FROM attempts WHERE run_id = %s", (old,)
        ).fetchone() == (0,)

        schedules = pgtick(role.dsn, "schedules", "pause", "every_minute")
        assert schedules.code == 0, schedules.err

        before = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
        refused = pgtick(role.dsn, "migrate")
        assert refused.code == 2, (refused.out, refused.err)
        line = refused.error
        assert line.startswith("pgtick: migrate: role "), line
        assert "not the owner of schema 'pgtick'" in line and "schema owner" in line, line
        assert conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall() == before

        daemon.signal(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.log()
        assert "permission denied" not in daemon.log(), daemon.log()
        assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)
