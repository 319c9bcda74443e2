"""The heartbeat judges a lease gone by claim (run id and attempt), not by run id alone."""

from __future__ import annotations

import signal
import time

from tests import dbhelp
from tests.acceptance.conftest import Cluster
from tests.acceptance.correctness import enqueue


def test_a_run_reclaimed_during_a_heartbeat_is_not_taken_for_lost(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """A heartbeat renews the leases it read (run id, attempt n). If run R's attempt n is
    written meanwhile (failed, due again at once) and this daemon claims R again (attempt
    n + 1) before the beat's answer is read, the beat reports R missing and
    Lifecycle.lost() looked R up by id only: it gave up the new claim, stopped its handler,
    dropped its result and stopped renewing a lease that was ours; the reaper then recorded
    a lost attempt and lease_expired."""
    daemon = cluster.start(
        cluster.config(
            threads=4, lease="1s", heartbeat="20ms", reaper="200ms", poll_interval="10ms"
        )
    )
    enqueue(conn, [("always_retry", {"after": 0.0})] * 8, max_attempts=100000)
    deadline = time.monotonic() + 10
    lost = []
    while time.monotonic() < deadline and not lost:
        lost = [e for e in daemon.events() if e["event"] == "lease_lost"]
        time.sleep(0.5)
    if lost:
        time.sleep(2.5)  # lease (1 s) + reaper interval: what the reaper does with it
    daemon.signal(signal.SIGTERM)
    daemon.wait(40)
    fates = [
        [
            *conn.execute(
                "SELECT outcome, error_type, finished_at FROM attempts"
                " WHERE run_id = %s AND attempt = %s",
                [e["run_id"], e["attempt"]],
            ).fetchall(),
            e["timestamp"],
        ]
        for e in lost[:3]
    ]
    # The lease given up was ours: the reaper took it only after the daemon gave it up.
    assert lost == [], (
        f"leases of live claims given up for lost: {lost[:3]}; their attempts: {fates}"
    )
