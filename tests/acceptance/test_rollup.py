"""Issue 46: the rollups behind the job type page's 24-hour and 7-day charts are kept by a
running daemon (its reaper's loop), match the runs and attempts they summarise (the daemon's
own and an earlier history it finds), and go with the daemon's retention."""

from __future__ import annotations

from tests.dbhelp import Connection, NewRun, Runs
from tests.integration.test_rollup import DIRECT, ROLLED, SEED

from .conftest import Cluster, wait_for

TYPES = """
[job_types.boom]
backoff = "fixed"
backoff_base = "1s"
jitter = 0.0
max_attempts = 2
"""
# A minute is rolled up ROLLUP_SETTLE_SECONDS (30) after its end, at the reaper's next pass
# after ROLLUP_EVERY_SECONDS (20): the last run's minute is in within about 2 minutes.
ROLLED_UP_WITHIN_SECONDS = 150.0


def test_a_running_daemon_rolls_up_what_it_ran(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    conn.execute(SEED)  # an earlier history, three hours ago
    daemon = cluster.start(cluster.config(TYPES, reaper="1s"))
    ok = store.enqueue_many([NewRun("record") for _ in range(20)])
    bad = store.enqueue_many([NewRun("boom") for _ in range(3)])
    gave_up = store.enqueue(NewRun("give_up"))
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status IN ('succeeded', 'dead')",
                [[*ok, *bad, gave_up]],
            ).fetchone()
            == (24,)
        ),
        30,
        what="every run ended",
    )
    [(last,)] = conn.execute(
        "SELECT max(finished_at) FROM attempts WHERE run_id = ANY(%s)", [[*ok, *bad, gave_up]]
    ).fetchall()
    upto = wait_for(
        lambda: (
            row[0]
            if (
                row := conn.execute(
                    "SELECT max(bucket) + interval '1 minute' FROM rollup_minutes"
                    " WHERE job_type = ''"
                ).fetchone()
            )[0]
            is not None
            and row[0] > last
            else None
        ),
        ROLLED_UP_WITHIN_SECONDS,
        interval=1.0,
        what="the last run's minute rolled up",
    )
    direct = conn.execute(DIRECT, {"upto": upto}).fetchall()
    rolled = conn.execute(ROLLED.format(table="rollup_minutes"), {"upto": upto}).fetchall()
    assert rolled == direct
    totals = {
        job_type: (succeeded, failed, dead)
        for job_type, succeeded, failed, dead in conn.execute(
            "SELECT job_type, sum(succeeded), sum(failed), sum(dead) FROM rollup_minutes"
            " WHERE job_type IN ('record', 'boom', 'give_up') GROUP BY 1"
        ).fetchall()
    }
    assert totals == {"record": (20, 0, 0), "boom": (0, 6, 3), "give_up": (0, 1, 1)}
    # The earlier history's hours are summed into rollup_hours (its hours are all closed).
    hours = conn.execute(
        "SELECT job_type, sum(succeeded), sum(dead), sum(lost), sum(skipped) FROM rollup_hours"
        " WHERE job_type IN ('mail', 'sms') GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert hours == [("mail", 30, 4, 0, 0), ("sms", 5, 0, 5, 2)]
    assert '"rollup_failed"' not in daemon.log()


RETENTION = """
[retention]
succeeded = "1h"
dead = "1h"
cancelled = "1h"
skipped = "1h"
"""


def test_the_daemons_retention_drops_old_rollups(cluster: Cluster, conn: Connection) -> None:
    # Rows from before the partitions of now (in the DEFAULT partitions, as an upgrade's
    # first roll-up leaves them) and past an hour's retention.
    conn.execute(
        "INSERT INTO rollup_minutes (job_type, bucket, succeeded)"
        " VALUES ('mail', date_trunc('minute', now()) - interval '2 hours', 3)"
    )
    conn.execute(
        "INSERT INTO rollup_hours (job_type, bucket, succeeded)"
        " VALUES ('mail', date_trunc('hour', now()) - interval '3 hours', 3)"
    )
    daemon = cluster.start(cluster.config(RETENTION, reaper="1s"))
    # Its retention pass (at its start, then every 5 minutes) creates the rollups'
    # partitions ahead and deletes what the DEFAULT partitions hold past the retention.
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM rollup_minutes WHERE job_type = 'mail'"
                " UNION ALL SELECT count(*) FROM rollup_hours WHERE job_type = 'mail'"
            ).fetchall()
            == [(0,), (0,)]
        ),
        60,
        interval=0.5,
        what="the old rollups deleted",
    )
    parents = {
        parent
        for (parent,) in conn.execute(
            "SELECT DISTINCT parent FROM partitions WHERE parent LIKE 'rollup%'"
        ).fetchall()
    }
    assert parents == {"rollup_minutes", "rollup_hours"}
    # And it rolls up from the hour before its retention on (what the next pass deletes).
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM rollup_minutes WHERE job_type = ''"
                " AND bucket >= now() - interval '2 hours'"
            ).fetchone()[0]  # type: ignore[index]
            >= 60
        ),
        30,
        what="the rollups since",
    )
    assert '"rollup_failed"' not in daemon.log()
