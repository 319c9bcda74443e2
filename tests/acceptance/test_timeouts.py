"""A Python handler's timeout fires at its deadline, and a handler past its timeout that keeps
running is not joined by its own retry in the same daemon."""

from __future__ import annotations

import signal

from tests import dbhelp
from tests.acceptance.conftest import Cluster, wait_for
from tests.acceptance.correctness import count, enqueue

TIMEOUT_TYPE = """
[job_types.per_attempt]
timeout = "1s"
backoff = "fixed"
backoff_base = "0s"
jitter = 0.0
"""


def test_a_timed_out_handler_still_running_is_not_joined_by_its_retry(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """The timeout writes the failure (retry due now) while the handler, deaf to
    ctx.cancelled, still runs; the failure removed the run from the lifecycle, so the next
    claim of the run by this same daemon started a second copy at once (a re-claimed run
    waited for its old copy only after an outage). It now waits for the old copy."""
    daemon = cluster.start(
        cluster.config(TIMEOUT_TYPE, threads=2, poll_interval="100ms", heartbeat="200ms")
    )
    [run_id] = enqueue(conn, [("per_attempt", {"seconds": [3.0, 0.1]})])
    try:
        wait_for(lambda: count(conn, "status = 'succeeded'") == 1, 20, what="succeeded")
        wait_for(lambda: cluster.executions("end")[run_id] == 2, 10, what="both copies ended")
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait(40)
    records = [r for r in cluster.records() if r["run_id"] == run_id]
    spans = {
        a: (
            next(r["t"] for r in records if r["attempt"] == a and r["event"] == "run"),
            next(r["t"] for r in records if r["attempt"] == a and r["event"] == "end"),
        )
        for a in (1, 2)
    }
    assert spans[2][0] >= spans[1][1], (
        f"attempt 2 started {spans[1][1] - spans[2][0]:.2f}s before attempt 1 ended "
        f"(same pid: {len({r['pid'] for r in records}) == 1})"
    )


def test_a_python_timeout_fires_at_its_deadline_not_at_the_next_heartbeat(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """Timeouts are checked by the heartbeat loop, which slept until the next beat or the
    earliest deadline it knew of when it went to sleep: a run started meanwhile was not
    looked at before the next beat (worker.heartbeat, 20 s by default), so a 1 s timeout
    did not stop a 4 s handler, and the run was recorded as succeeded. A run with a
    timeout now wakes the loop when it starts."""
    daemon = cluster.start(cluster.config(TIMEOUT_TYPE, threads=2))
    [run_id] = enqueue(conn, [("per_attempt", {"seconds": [4.0]})], max_attempts=1)
    try:
        wait_for(lambda: count(conn, "status IN ('succeeded', 'dead')") == 1, 20, what="finished")
    finally:
        daemon.signal(signal.SIGTERM)
        daemon.wait(40)
    row = conn.execute(
        "SELECT status, error_type, finished_at - started_at FROM runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row is not None
    assert row[:2] == ("dead", "timeout"), f"a 1 s timeout on a 4 s handler: {row}"
