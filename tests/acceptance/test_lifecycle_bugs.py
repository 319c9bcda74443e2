"""The run-lifecycle bugs a review reproduced, each against a real `pgtick run` process: every
test here failed on the code before lifecycle.py and passes now."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection, NewRun, Runs


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def test_a_command_ignoring_sigterm_is_gone_before_its_run_is_released(
    cluster: Cluster, store: Runs, conn: Connection, tmp_path: Path
) -> None:
    """Bug 2: the drain used to release the run ~2.5 s after cancelling while the command was
    SIGKILLed only after 3 s, so a command that ignores SIGTERM outlived a daemon that exited
    0, its run back in `queued` for another daemon to start: two copies at once."""
    pidfile = tmp_path / "trapper.pid"
    script = f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.2; done"
    extra = f'\n[job_types.trapper]\ncommand = ["/bin/sh", "-c", "{script}"]\n'
    daemon = cluster.start(cluster.config(extra, grace="1s"))
    [run_id] = store.enqueue_many([NewRun("trapper")])
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="command up")
    pgid = int(pidfile.read_text())
    assert _group_members(pgid)
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0
    assert _group_members(pgid) == [], "the command outlived the daemon"
    events = daemon.events()
    [sigkill] = [e for e in events if e["event"] == "command_sigkill"]
    row = conn.execute(
        "SELECT r.status, r.attempts, a.outcome, a.finished_at "
        "FROM runs r JOIN attempts a ON a.run_id = r.id WHERE r.id = %s",
        [run_id],
    ).fetchone()
    assert row is not None
    status, attempts, outcome, released_at = row
    assert (status, attempts, outcome) == ("queued", 0, "released")
    # Released only after the group was killed (one host: the log's clock is the database's).
    assert released_at >= datetime.fromisoformat(sigkill["timestamp"])
    drained = next(e for e in events if e["event"] == "drained")
    assert (drained["released"], drained["left_running"]) == (1, 0)


def test_prefetched_runs_are_released_on_sigterm_and_nothing_is_claimed_after(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 3, second half: with prefetch, SIGTERM gives back every claimed run no
    thread started, and no claim is accepted once the drain has begun."""
    daemon = cluster.start(cluster.config(threads=1, prefetch=4, grace="2s"))
    # Short runs first: the daemon claims ahead only once it has seen handlers finish fast.
    store.enqueue_many([NewRun("record") for _ in range(20)])
    wait_for(lambda: len(cluster.executions()) == 20, 10, what="warm-up runs")
    ids = store.enqueue_many([NewRun("polite", {"seconds": 60}) for _ in range(5)])
    wait_for(lambda: len(cluster.executions()) == 21, 10, what="one started")
    wait_for(
        lambda: (
            conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone() == (5,)
        ),
        10,
        what="four more prefetched",
    )
    # More work arrives while it drains: none of it may be claimed by this daemon.
    late = store.enqueue_many([NewRun("polite", {"seconds": 60}) for _ in range(3)])
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    rows = conn.execute(
        "SELECT r.id, r.status, r.attempts, array_agg(a.outcome ORDER BY a.id) "
        "FROM runs r LEFT JOIN attempts a ON a.run_id = r.id"
        " GROUP BY r.id, r.status, r.attempts ORDER BY r.id"
    ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    for run_id in ids:
        assert by_id[run_id] == ("queued", 0, ["released"]), by_id[run_id]
    for run_id in late:
        assert by_id[run_id] == ("queued", 0, [None]), by_id[run_id]
    assert len(cluster.executions()) == 21  # the 4 prefetched never started
    drained = next(e for e in daemon.events() if e["event"] == "drained")
    assert drained["released"] == 5


def test_a_run_committed_by_its_transaction_is_not_reported_lost(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Bug 4: after ctx.transaction() committed the success (clearing the lease), the next
    heartbeat found the lease gone, cancelled the handler and counted the run as lost."""
    daemon = cluster.start(cluster.config(lease="3s", heartbeat="500ms"))
    [run_id] = store.enqueue_many([NewRun("commit_then_linger", {"linger": 2.0})])
    wait_for(lambda: cluster.executions("done") or cluster.executions("cancelled"), 15)
    assert cluster.executions("cancelled") == {}, "the handler was told to stop"
    assert cluster.executions("done") == {run_id: 1}
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    events = [e["event"] for e in daemon.events()]
    assert "lease_lost" not in events
    assert conn.execute("SELECT status FROM runs WHERE id = %s", [run_id]).fetchone() == (
        "succeeded",
    )
    outcomes = conn.execute("SELECT outcome FROM attempts WHERE run_id = %s", [run_id]).fetchall()
    assert outcomes == [("succeeded",)]


def test_heartbeats_keep_leases_while_handlers_hold_every_pool_connection(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Bug 5: the heartbeat took its connection from the workers' pool, one short of what the
    loops pin, so handlers holding connections made it wait (up to the pool timeout) and the
    leases expired: runs looked stuck and other daemons' reapers could take them. Now the
    heartbeat has a connection of its own."""
    extra = "\n[database]\npool_size = 1\n"
    daemon = cluster.start(cluster.config(extra, threads=2, lease="2s", heartbeat="500ms"))
    ids = store.enqueue_many([NewRun("hog", {"connections": 50, "seconds": 5.0}) for _ in range(2)])
    wait_for(lambda: len(cluster.executions("hogging")) == 2, 10, what="pool exhausted")
    hogged = sum(r["connections"] for r in cluster.records() if r["event"] == "hogging")
    assert hogged >= 1  # every free connection of the pool is taken
    stuck_seen = 0
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline and len(cluster.executions("done")) < 2:
        (stuck,) = conn.execute(  # type: ignore[misc]
            "SELECT count(*) FROM runs WHERE status = 'running' AND locked_until < now()"
        ).fetchone()
        stuck_seen = max(stuck_seen, stuck)
        time.sleep(0.1)  # sampling the table, not synchronising
    wait_for(lambda: len(cluster.executions("done")) == 2, 15, what="handlers done")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert stuck_seen == 0, "leases expired while the pool was busy"
    rows = conn.execute("SELECT status, attempts FROM runs WHERE id = ANY(%s)", [ids]).fetchall()
    assert rows == [("succeeded", 1), ("succeeded", 1)]
    assert "lease_lost" not in [e["event"] for e in daemon.events()]
