"""A run_at outside what Python can read (years 1 to 9999 in UTC). `pgtick enqueue --run-at`
refuses one (exit 2 naming the option): `0001-01-01T00:00:00+01:00` is 1 BC in UTC and
`9999-12-31T23:59:59-14:00` year 10000, and once stored every read of the run failed
("timestamp too small"). One written by hand (the tables are the contract) no longer stops
the daemon: the claim's result failed to load after the claim had committed, and the runs it
claimed stayed `running`, never executed."""

from __future__ import annotations

import pytest

from tests import dbhelp
from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster, wait_for

EDGES = {
    "1 BC in UTC": "0001-01-01T00:00:00+01:00",
    "year 10000 in UTC": "9999-12-31T23:59:59-14:00",
}


@pytest.mark.parametrize("name", list(EDGES))
def test_enqueue_refuses_a_run_at_outside_the_readable_range(
    name: str, dsn: str, conn: dbhelp.Connection
) -> None:
    result = pgtick(dsn, "enqueue", "noop", "--run-at", EDGES[name])
    assert result.code == 2, result
    assert "--run-at" in result.err[-1] and "out of range" in result.err[-1], result.err
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_a_run_at_written_by_hand_outside_the_range_does_not_stop_the_daemon(
    dsn: str, conn: dbhelp.Connection, cluster: Cluster
) -> None:
    poisoned = conn.execute(
        "INSERT INTO runs (job_type, run_at) VALUES ('record', '0001-01-01 00:00:00+00 BC'),"
        " ('record', '-infinity') RETURNING id"
    ).fetchall()
    innocent = pgtick(dsn, "enqueue", "record")
    assert innocent.code == 0, innocent
    cluster.start()
    wanted = {int(run_id) for (run_id,) in poisoned} | {int(innocent.out[-1])}
    wait_for(
        lambda: wanted <= set(cluster.executions()),
        timeout=15,
        what=f"runs {sorted(wanted)} to run",
    )
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone() == (3,)
        ),
        timeout=15,
        what="the three runs to succeed",
    )
