"""No run is held where the lifecycle cannot see it: a handler that blocks its thread holds
back nothing but its own run, its batch-mates' results are written at once, and a SIGTERM in
the middle of short and blocking runs loses no success. Each test failed before the fix (the
worker took up to 16 runs per thread and submitted their results after the whole batch)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.correctness import count, enqueue, statuses


def _gate(tmp_path: Path) -> Path:
    gate = tmp_path / "gate"
    gate.touch()
    return gate


def test_a_blocked_handler_holds_back_no_other_run(
    cluster: Cluster, conn: dbhelp.Connection, tmp_path: Path
) -> None:
    """Items 1 and 2: with one of two threads blocked, every other run succeeds at once,
    those claimed with the blocked one included; only the blocked run is still running."""
    gate = _gate(tmp_path)
    daemon = cluster.start(cluster.config(threads=2, prefetch=256, lease="3s", heartbeat="1s"))
    items = [("span", {"sleep": 0})] * 300
    items[99] = ("hold", {"path": str(gate), "max": 60})
    ids = enqueue(conn, items, max_attempts=1)
    blocker = ids[99]
    wait_for(lambda: blocker in cluster.executions(), 20, what="the blocker started")
    wait_for(
        lambda: count(conn, "status = 'succeeded'") == len(ids) - 1,
        10,
        what="every run but the blocked one succeeded while it blocks",
    )
    assert statuses(conn)[blocker] == "running"
    gate.unlink()
    wait_for(lambda: count(conn, "status = 'succeeded'") == len(ids), 10, what="all done")
    assert cluster.executions() == dict.fromkeys(ids, 1)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0


def test_runs_claimed_ahead_of_a_blocked_pool_go_back_to_the_queue(
    cluster: Cluster, conn: dbhelp.Connection, tmp_path: Path
) -> None:
    """Item 2: runs claimed ahead (prefetch) that no thread can start, because the only thread
    is blocked, are given back to the queue after a heartbeat instead of being renewed for as
    long as the handler blocks: an idle daemon runs them meanwhile."""
    gate = _gate(tmp_path)
    first = cluster.start(
        cluster.config(threads=1, prefetch=256, lease="3s", heartbeat="500ms", poll_interval="1s")
    )
    items = [("span", {"sleep": 0})] * 200
    items[59] = ("hold", {"path": str(gate), "max": 60})
    ids = enqueue(conn, items, max_attempts=1)
    blocker = ids[59]
    wait_for(lambda: blocker in cluster.executions(), 20, what="the blocker started")
    second = cluster.start(cluster.config(threads=2, prefetch=0, poll_interval="1s"))
    wait_for(
        lambda: count(conn, "status = 'succeeded'") == len(ids) - 1,
        15,
        what="every other run done while the first daemon's only thread blocks",
    )
    assert statuses(conn)[blocker] == "running"
    released = conn.execute("SELECT count(*) FROM attempts WHERE outcome = 'released'").fetchone()
    assert released is not None and released[0] > 0, "no run was claimed ahead: test is moot"
    gate.unlink()
    wait_for(lambda: count(conn, "status = 'succeeded'") == len(ids), 10, what="all done")
    assert cluster.executions() == dict.fromkeys(ids, 1)
    for daemon in (first, second):
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_sigterm_amid_short_and_blocking_runs_loses_no_success(
    cluster: Cluster, conn: dbhelp.Connection, tmp_path: Path
) -> None:
    """Must show 2: SIGTERM while both threads are blocked in the middle of a stream of short
    runs, with max_attempts 1. Every run whose handler returned normally ends `succeeded`
    (before the fix, the results withheld in a thread's batch were never written and the runs
    were reaped `dead`); the blocked runs are released and run again by the next daemon."""
    gate = _gate(tmp_path)
    settings = {"threads": 2, "prefetch": 256, "lease": "3s", "heartbeat": "1s"}
    first = cluster.start(cluster.config(grace="1s", reaper="500ms", **settings))
    items = [("span", {"sleep": 0})] * 400
    for position in (149, 299):
        items[position] = ("hold", {"path": str(gate), "max": 60})
    ids = enqueue(conn, items, max_attempts=1)
    blockers = [ids[149], ids[299]]
    wait_for(
        lambda: all(b in cluster.executions() for b in blockers), 20, what="both threads blocked"
    )
    time.sleep(0.3)  # let the results of the runs before them reach the writer, or not
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0
    second = cluster.start(cluster.config(reaper="500ms", **settings))
    gate.unlink()
    wait_for(
        lambda: count(conn, "status IN ('queued', 'running', 'failed')") == 0,
        30,
        what="every run finished",
    )
    returned = {r["run_id"] for r in cluster.records() if r["event"] == "end"}
    final = statuses(conn)
    wrong = {run_id: final[run_id] for run_id in returned if final[run_id] != "succeeded"}
    assert not wrong, f"runs that returned normally but did not succeed: {wrong}"
    assert set(final.values()) == {"succeeded"}
    second.signal(signal.SIGTERM)
    assert second.wait(20) == 0


def test_the_drain_waits_for_results_still_being_written(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """Item 7, first half: results still queued for the writer when the drain ends were
    dropped (the drain waited 1.5 s, then closed the pools and exited 0), and their runs were
    later reaped as lost. A transaction of the test holds a run's row locked, so the writer's
    first batch waits on it and the next result queues behind; SIGTERM then; the lock goes
    4 s later. Both results must be written before the daemon exits."""
    daemon = cluster.start(cluster.config(threads=1, prefetch=0, grace="5s"))
    [first] = enqueue(conn, [("span", {"sleep": 1.0})], max_attempts=1)
    wait_for(lambda: first in cluster.executions(), 10, what="first run started")
    with dbhelp.connect(dsn, "pgtick") as locker, locker.transaction():
        locker.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", [first])
        [second] = enqueue(conn, [("span", {"sleep": 0})], max_attempts=1)
        wait_for(lambda: second in cluster.executions("end"), 10, what="second run returned")
        time.sleep(0.2)  # its result reaches the writer's queue
        daemon.signal(signal.SIGTERM)
        time.sleep(4.0)
        assert daemon.proc.poll() is None, "exited while results were still unwritten"
    assert daemon.wait(20) == 0
    final = statuses(conn)
    assert (final[first], final[second]) == ("succeeded", "succeeded")
    outcomes = conn.execute("SELECT outcome FROM attempts ORDER BY run_id").fetchall()
    assert outcomes == [("succeeded",), ("succeeded",)]
