"""Claiming ahead (worker.prefetch) speeds up a backlog of short runs without taking long
runs away from other daemons that could start them now."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection, NewRun, Runs


def test_a_busy_daemon_does_not_hoard_a_backlog_of_long_runs(
    cluster: Cluster, store: Runs, conn: Connection, tmp_path: Path
) -> None:
    """While its threads are busy with long runs, a daemon leaves the rest of the backlog
    queued for whoever arrives. The backlog's runs wait at a gate (a file) until the second
    daemon is up, so how long a daemon takes to start on a loaded machine does not decide the
    outcome (with 0.5 s runs alone, a second daemon that took 4 s to start found none left)."""
    gate = tmp_path / "gate"
    first = cluster.start(cluster.config(threads=2, prefetch=64, processes=1))
    # Handlers that took 0.5 s: what makes the worker claim nothing ahead of its threads.
    store.enqueue_many([NewRun("record", {"sleep": 0.5}) for _ in range(2)])
    wait_for(lambda: succeeded(conn) == 2, 30, what="first runs done")
    ids = store.enqueue_many(
        [NewRun("gated", {"gate": str(gate), "sleep": 0.5}) for _ in range(16)]
    )
    wait_for(lambda: at_gate(cluster) == 2, 30, what="first daemon busy")
    second = cluster.start(cluster.config(threads=2, prefetch=64, processes=1))
    wait_for(lambda: at_gate(cluster) == 4, 30, what="second daemon busy")
    # Each daemon holds what its threads run, and nothing more: 12 runs wait for either.
    held = conn.execute(
        "SELECT count(*) FROM runs WHERE status = 'running' GROUP BY locked_by"
    ).fetchall()
    assert sorted(n for (n,) in held) == [2, 2], held
    assert conn.execute("SELECT count(*) FROM runs WHERE status = 'queued'").fetchone() == (12,)
    gate.touch()
    wait_for(lambda: succeeded(conn) == 18, 60, what="backlog done")
    by_pid = Counter(r["pid"] for r in cluster.records() if r["event"] == "run")
    assert sum(by_pid.values()) == 18 and len(cluster.executions()) == 2 + len(ids)
    # The second daemon, arrived with 12 runs left, took its share of them too.
    assert by_pid[second.pid] >= 4, by_pid
    for daemon in (first, second):
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def succeeded(conn: Connection) -> int:
    (n,) = conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone()  # type: ignore[misc]
    return int(n)


def at_gate(cluster: Cluster) -> int:
    """Gated runs whose handlers have started."""
    return sum(1 for r in cluster.records() if r["event"] == "run" and r.get("gated"))


def test_a_backlog_of_short_runs_is_claimed_ahead(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """With no-op runs, claims carry more than the free threads (prefetch grows with the
    backlog): one claim statement gives its runs the same started_at (now() of its
    transaction), so the attempts table shows how many each claim carried."""
    daemon = cluster.start(cluster.config(threads=2, prefetch=64, processes=1))
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
