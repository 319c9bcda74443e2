"""Three daemons at the product's defaults (8 threads, prefetch up to 256) on one database:
every run exactly once, and a SIGTERM in the middle of a prefetched backlog gives back every
run that daemon had claimed and not started.

Each run sleeps 2 ms, so the threads, not the claims, are the bottleneck and every daemon
holds a prefetched backlog at any moment: with no-op runs on a loaded machine, the one stopped
could hold none at the instant of its SIGTERM (a CI run saw 0 released)."""

from __future__ import annotations

import signal

import pytest

from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection, Runs

RUNS = 50_000


@pytest.mark.timeout(300)
def test_three_daemons_at_defaults_drain_50000_runs_once_and_sigterm_releases_prefetch(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    config = cluster.config(threads=8, prefetch=256, level="info")
    daemons = [cluster.start(config) for _ in range(3)]
    conn.execute(
        "INSERT INTO runs (job_type, payload) "
        "SELECT 'record', '{\"sleep\": 0.002}' FROM generate_series(1, %s)",
        [RUNS],
    )
    conn.execute("NOTIFY pgtick, 'record'")

    def succeeded() -> int:
        (n,) = conn.execute(  # type: ignore[misc]
            "SELECT count(*) FROM runs WHERE status = 'succeeded'"
        ).fetchone()
        return int(n)

    wait_for(lambda: succeeded() >= RUNS // 4, 120, what="a quarter drained")
    stopped = daemons[0]
    stopped.signal(signal.SIGTERM)
    assert stopped.wait(60) == 0
    wait_for(lambda: succeeded() == RUNS, 240, interval=0.5, what="all drained")
    for daemon in daemons[1:]:
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(60) == 0

    # Exactly once: one succeeded attempt per run, one execution each in the handlers' log.
    rows = conn.execute(
        "SELECT count(*) FILTER (WHERE outcome = 'succeeded'), "
        "count(*) FILTER (WHERE outcome = 'released'), count(*) FILTER (WHERE outcome IS NULL), "
        "count(*) FILTER (WHERE outcome NOT IN ('succeeded', 'released')) FROM attempts"
    ).fetchone()
    assert rows is not None
    ok, released, open_, other = rows
    assert (ok, open_, other) == (RUNS, 0, 0)
    per_run = conn.execute(
        "SELECT count(*) FROM (SELECT run_id FROM attempts WHERE outcome = 'succeeded' "
        "GROUP BY run_id HAVING count(*) <> 1) d"
    ).fetchone()
    assert per_run == (0,)
    executions = cluster.executions()
    assert len(executions) == RUNS and set(executions.values()) == {1}
    # The stopped daemon gave back every run it had claimed and not started: each is an
    # attempt row 'released', and the drain's own count says the same.
    drained = next(e for e in stopped.events() if e["event"] == "drained")
    assert drained["released"] == released > 0
    assert conn.execute(
        "SELECT count(*) FROM runs WHERE status <> 'succeeded' OR locked_by IS NOT NULL"
    ).fetchone() == (0,)
    per_daemon = {d.pid: n for d in daemons if (n := _count(cluster, d.pid))}
    assert len(per_daemon) == 3, per_daemon  # every daemon took a share
    # And no daemon saw a database error on the way (a claim, beat or reap that met a run
    # another transaction had finished and moved meanwhile once did).
    failed = [e for d in daemons for e in d.events() if str(e["event"]).endswith("_failed")]
    assert failed == [], failed[:3]


def _count(cluster: Cluster, pid: int) -> int:
    return sum(1 for r in cluster.records() if r["event"] == "run" and r["pid"] == pid)
