"""Item 3: a handler that raises a BaseException (sys.exit(), KeyboardInterrupt or GeneratorExit
from a library) fails its run and costs no thread; a handler thread that dies anyway is
noticed and the daemon stops loudly. Both tests failed before the fix: the thread ended
silently, its run stayed `running` with a renewed lease, and the daemon carried on."""

from __future__ import annotations

import signal
import time

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.correctness import count, enqueue, statuses


def test_sys_exit_in_a_handler_fails_its_run_and_keeps_the_thread(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    daemon = cluster.start(cluster.config(threads=2, lease="3s", heartbeat="1s"))
    failing = enqueue(
        conn,
        [
            ("exits", {"code": 1}),
            ("raises_base", {"kind": "KeyboardInterrupt"}),
            ("raises_base", {"kind": "GeneratorExit"}),
        ],
        max_attempts=1,
    )
    wait_for(lambda: count(conn, "status = 'dead'") == 3, 10, what="the three runs failed")
    rows = conn.execute(
        "SELECT r.id, r.error_type, r.last_error, a.outcome, a.error_type "
        "FROM runs r JOIN attempts a ON a.run_id = r.id ORDER BY r.id"
    ).fetchall()
    assert [(r[1], r[3], r[4]) for r in rows] == [
        ("SystemExit", "failed", "SystemExit"),
        ("KeyboardInterrupt", "failed", "KeyboardInterrupt"),
        ("GeneratorExit", "failed", "GeneratorExit"),
    ]
    assert rows[0][2] == "SystemExit: 1"
    # Both threads still work: two runs of 1 s each overlap in time.
    spans = enqueue(conn, [("span", {"sleep": 1.0})] * 2)
    wait_for(lambda: count(conn, "status = 'succeeded'") == 2, 10, what="both threads ran")
    starts = [r["t"] for r in cluster.records() if r["event"] == "run" and r["run_id"] in spans]
    ends = [r["t"] for r in cluster.records() if r["event"] == "end" and r["run_id"] in spans]
    assert len(starts) == len(ends) == 2
    assert max(starts) < min(ends), "the two runs did not run at once"
    events = [e for e in daemon.events() if e.get("event") == "handler_raised_base_exception"]
    logged = {e["run_id"]: e["error_type"] for e in events}
    kinds = ["SystemExit", "KeyboardInterrupt", "GeneratorExit"]
    assert logged == dict(zip(failing, kinds, strict=True))
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    assert "Traceback" not in daemon.log()


def test_a_handler_thread_that_dies_stops_the_daemon_loudly(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """A SystemExit raised asynchronously in the worker thread after its handler returned
    kills the thread outside any handler: the supervisor must see it, log which thread died,
    and stop with exit 1 (systemd restarts it) instead of running on with fewer threads; the
    run the thread would have started is released, not lost."""
    daemon = cluster.start(cluster.config(threads=1, lease="3s", heartbeat="1s", grace="1s"))
    [first] = enqueue(conn, [("kills_its_thread", {"after": 0.3})])
    wait_for(lambda: statuses(conn)[first] == "succeeded", 10, what="the first run succeeded")
    time.sleep(0.6)  # the timer has raised SystemExit into the idle thread
    [second] = enqueue(conn, [("span", {"sleep": 0})])  # wakes the thread, which dies
    assert daemon.wait(15) == 1
    died = [e for e in daemon.events() if e.get("event") == "loop_died"]
    assert died and "pgtick-worker-0" in died[0]["loops"], daemon.log()
    assert statuses(conn)[second] == "queued"
    assert second not in cluster.executions()
