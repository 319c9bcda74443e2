"""Claiming ahead (worker.prefetch) speeds up a backlog of short runs without taking long
runs away from other daemons that could start them now."""

from __future__ import annotations

import signal
from collections import Counter

from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection, NewRun, Runs


def test_a_busy_daemon_does_not_hoard_a_backlog_of_long_runs(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    first = cluster.start(cluster.config(threads=2, prefetch=64))
    ids = store.enqueue_many([NewRun("record", {"sleep": 0.5}) for _ in range(16)])
    wait_for(lambda: len(cluster.executions()) >= 4, 10, what="first daemon busy")
    second = cluster.start(cluster.config(threads=2, prefetch=64))
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone() == (16,)
        ),
        30,
        what="backlog done",
    )
    by_pid = Counter(r["pid"] for r in cluster.records() if r["event"] == "run")
    assert sum(by_pid.values()) == 16 and len(cluster.executions()) == len(ids)
    # The second daemon arrived with at most 12 runs left; it must have taken its share
    # instead of waiting while the first held them claimed.
    assert by_pid[second.pid] >= 4, by_pid
    for daemon in (first, second):
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_a_backlog_of_short_runs_is_claimed_ahead(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """With no-op runs, claims carry more than the free threads (prefetch grows with the
    backlog): one claim statement gives its runs the same started_at (now() of its
    transaction), so the attempts table shows how many each claim carried."""
    daemon = cluster.start(cluster.config(threads=2, prefetch=64))
    store.enqueue_many([NewRun("record") for _ in range(2000)])
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone()
            == (2000,)
        ),
        60,
        what="drained",
    )
    (largest,) = conn.execute(  # type: ignore[misc]
        "SELECT max(n) FROM (SELECT count(*) AS n FROM attempts GROUP BY started_at) c"
    ).fetchone()
    assert largest > 2, largest  # more than the two free threads in one claim
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
