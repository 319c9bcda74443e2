"""`pgtick cancel` of a running run: the daemon holding it learns it at its next heartbeat,
tells the handler to stop (ctx.cancelled; a command is killed) and writes nothing over it."""

from __future__ import annotations

import signal
import time

from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import Cluster, wait_for
from tests.dbhelp import Connection, NewRun, Runs

HEARTBEAT_SECONDS = 0.5


def test_cancelling_a_running_run_stops_its_handler_within_a_heartbeat(
    cluster: Cluster, store: Runs, conn: Connection, dsn: str
) -> None:
    daemon = cluster.start(cluster.config(lease="3s", heartbeat=f"{HEARTBEAT_SECONDS}s"))
    [run_id] = store.enqueue_many([NewRun("yielding", {"seconds": 30})])
    wait_for(lambda: cluster.executions() == {run_id: 1}, 10, what="running")
    result = pgtick(dsn, "cancel", str(run_id))
    # From the CLI's exit, just after its commit: its start (an interpreter and its imports,
    # over a second on a loaded 2-core machine) is not the daemon's delay.
    asked = time.time()
    assert result.code == 0, result
    wait_for(lambda: cluster.executions("cancelled"), 5, what="handler told to stop")
    [seen] = [r for r in cluster.records() if r["event"] == "cancelled"]
    assert seen["t"] - asked < HEARTBEAT_SECONDS + 1.0  # one heartbeat, plus this machine
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    # The handler returned normally (a success to drop): the run stays cancelled.
    row = conn.execute(
        "SELECT status, locked_by, last_error FROM runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row is not None and row[:2] == ("cancelled", None)
    attempts = conn.execute(
        "SELECT outcome, error FROM attempts WHERE run_id = %s", [run_id]
    ).fetchall()
    assert attempts == [("lost", "cancelled by operator")]
    events = daemon.events()
    [cancelled] = [e for e in events if e["event"] == "run_cancelled"]
    assert cancelled["run_id"] == run_id
    assert not [e for e in events if e["event"] == "lease_lost"]
    assert not cluster.executions("done")
