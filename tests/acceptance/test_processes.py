"""``worker.processes = 2``: a supervisor and two worker processes as real processes on a real
PostgreSQL, signalled for real (issue 47)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.acceptance.conftest import Cluster, Daemon, status_counts, wait_for
from tests.dbhelp import Connection, NewRun, Runs


def children(daemon: Daemon) -> set[int]:
    """The pids of the live worker processes of ``daemon`` (its children, from /proc)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) != daemon.pid or stat[0] == "Z":
            continue
        try:  # not multiprocessing's resource tracker, the daemon's third child
            if b"spawn_main" in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent, the test, has not reaped it).
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def worker_rows(conn: Connection) -> dict[int, str]:
    """{pid: worker id} of the registered workers."""
    return {pid: wid for wid, pid in conn.execute("SELECT id, pid FROM workers").fetchall()}


def start_two(cluster: Cluster, conn: Connection, **settings: object) -> tuple[Daemon, set[int]]:
    daemon = cluster.start(cluster.config(processes=2, **settings))
    wait_for(lambda: len(children(daemon)) == 2, 20, what="two worker processes")
    pids = children(daemon)
    wait_for(lambda: set(worker_rows(conn)) == pids, 20, what="both registered")
    return daemon, pids


def test_two_processes_drain_every_run_once_and_stop_on_sigterm(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    daemon, pids = start_two(cluster, conn)
    store.enqueue_many([NewRun("record", {}) for _ in range(500)])
    wait_for(lambda: status_counts(conn) == {"succeeded": 500}, 60, what="all succeeded")
    executions = cluster.executions()
    assert len(executions) == 500 and set(executions.values()) == {1}
    ran_in = {r["pid"] for r in cluster.records()}
    assert ran_in <= pids and daemon.pid not in ran_in
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert not any(alive(p) for p in pids)
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)
