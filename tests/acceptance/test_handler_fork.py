"""A Python handler that forks a child which ends with sys.exit(): the child exits. Before, its
SystemExit was caught as the handler's failure and the child, a copy of the daemon, carried on
in the worker loop, starting the runs claimed ahead (which the daemon ran too), and never
exited."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.correctness import count, enqueue

FORK_TYPES = """
[job_types.forker]
handler = "hostile_jobs:forker"
"""


def test_a_forked_child_that_calls_sys_exit_exits_and_runs_nothing_else(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """The child's SystemExit is caught by handlers.execute as a handler failure, and the
    child, a copy of the daemon, carries on in the worker loop: it starts the runs claimed
    ahead in its copy of the queue (the parent runs them too) and then never exits."""
    daemon = cluster.start(cluster.config(FORK_TYPES, threads=1, prefetch=8))
    enqueue(conn, [("record", {})] * 20)  # handlers seen to be fast: claims go ahead
    wait_for(lambda: count(conn, "status = 'succeeded'") == 20, 10, what="warm-up")
    ids = enqueue(conn, [("forker", {"before": 0.5})] + [("record", {"sleep": 0.2})] * 4)
    children: list[int] = []
    try:
        wait_for(lambda: count(conn, "status = 'succeeded'") == 25, 20, what="all done")
        time.sleep(1.0)  # what a lingering child does, it does by now
        records = [r for r in cluster.records() if r["run_id"] in ids]
        children = [r["child"] for r in records if r["event"] == "forked"]
        pids = {
            r["run_id"]: sorted(
                {x["pid"] for x in records if x["run_id"] == r["run_id"] and x["event"] == "run"}
            )
            for r in records
        }
        alive = [c for c in children if _alive(c)]
        twice = {rid: p for rid, p in pids.items() if len(p) > 1}
        assert twice == {}, f"runs executed by two processes (daemon {daemon.pid}): {twice}"
        assert alive == [], f"forked children still alive: {alive}"
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        daemon.signal(signal.SIGTERM)
        daemon.wait(40)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
