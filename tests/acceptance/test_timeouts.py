"""A Python handler's timeout fires at its deadline; a handler past its timeout that keeps
running keeps its run held until it returns: its max_running slot stays taken and its retry
starts on no daemon meanwhile; a stop writes the timeout of one that never returns."""

from __future__ import annotations

import signal
import time

from tests import dbhelp
from tests.acceptance.cli import pgtick
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


# A job type whose handler (flow_jobs, records "start" and "end" lines) sleeps or blocks
# through ctx.cancelled; the lease shorter than the handler, so only the renewal of a
# timed-out run's lease keeps it held.
HELD_TIMEOUT_TYPE = """
[job_types.work]
handler = "flow_jobs:{handler}"
timeout = "2s"
lease = "3s"
backoff = "fixed"
backoff_base = "0s"
jitter = 0.0
{limits}
"""


def _spans(cluster: Cluster) -> dict[tuple[int, int], tuple[float, float]]:
    """(run id, attempt): (start, end) of every handler that ended, from its own records."""
    records = cluster.records()
    starts = {(r["run_id"], r["attempt"]): r["t"] for r in records if r["event"] == "start"}
    ends = {(r["run_id"], r["attempt"]): r["t"] for r in records if r["event"] == "end"}
    return {k: (starts[k], ends[k]) for k in ends}


def _overlapping(spans: dict[tuple[int, int], tuple[float, float]]) -> list[str]:
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    return [
        f"run {a[0]} attempt {a[1]} ({sa:.2f}-{ea:.2f}) and run {b[0]} attempt {b[1]} "
        f"({sb:.2f}-{eb:.2f})"
        for i, (a, (sa, ea)) in enumerate(ordered)
        for b, (sb, eb) in ordered[i + 1 :]
        if sb < ea
    ]


def test_a_timed_out_handler_keeps_its_max_running_slot_until_it_returns(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """max_running = 1, timeout 2 s, three handlers of 6 s deaf to ctx.cancelled, two
    daemons: the timeout wrote the failure and cleared the lease while the handler ran on,
    so the slot was free and the next run started beside it: three ran at once. A run past
    its timeout is now held (counted, its lease renewed) until its handler returns, and the
    attempt is written then, failed with the timeout."""
    config = cluster.config(
        HELD_TIMEOUT_TYPE.format(handler="work", limits="max_running = 1"),
        threads=2,
        poll_interval="200ms",
        heartbeat="500ms",
    )
    for _ in range(2):
        cluster.start(config)
    ids = enqueue(conn, [("work", {"sleep": 6.0})] * 3, max_attempts=1)
    try:
        wait_for(lambda: count(conn, "status = 'dead'") == 3, 90, 0.2, what="three runs dead")
        wait_for(lambda: len(_spans(cluster)) == 3, 10, what="three handlers ended")
    finally:
        for daemon in cluster.daemons:
            daemon.signal(signal.SIGTERM)
        for daemon in cluster.daemons:
            daemon.wait(40)
    spans = _spans(cluster)
    assert not _overlapping(spans), f"handlers of max_running = 1 at once: {_overlapping(spans)}"
    attempts = conn.execute(
        "SELECT run_id, outcome, error_type, extract(epoch FROM finished_at - started_at) "
        "FROM attempts WHERE run_id = ANY(%s) ORDER BY run_id",
        [ids],
    ).fetchall()
    assert [(a[0], a[1], a[2]) for a in attempts] == [(i, "failed", "timeout") for i in ids]
    # Written when the handler returned, not at the deadline.
    assert all(a[3] >= 5.5 for a in attempts), attempts


def test_the_retry_of_a_timed_out_run_waits_for_its_handler_on_every_daemon(
    cluster: Cluster, conn: dbhelp.Connection, dsn: str
) -> None:
    """A run with retries left times out while its handler, deaf to ctx.cancelled, blocks
    on: the failure was written at the deadline with the retry due at once, and the other
    daemon claimed and started the retry beside the first handler (the same daemon's own
    claim of it waited; the other's did not). The run now stays running, held by the first
    daemon, until that handler returns; `pgtick show` says it is stopping after its
    timeout, not that it waits for a retry."""
    config = cluster.config(
        HELD_TIMEOUT_TYPE.format(handler="stuck", limits=""),
        threads=1,
        poll_interval="100ms",
        heartbeat="500ms",
    )
    for _ in range(2):
        cluster.start(config)
    release = cluster.tmp_path / "release"
    [run_id] = enqueue(conn, [("work", {"until": str(release)})], max_attempts=2)
    try:
        wait_for(
            lambda: count(conn, "status = 'running' AND error_type = 'timeout'") == 1,
            20,
            what="timed out, its handler still running",
        )
        shown = pgtick(dsn, "show", str(run_id))
        # Past the 3 s lease too: only its renewal keeps the run held.
        started = min(r["t"] for r in cluster.records() if r["event"] == "start")
        time.sleep(max(0.0, started + 6.0 - time.time()))
        during = conn.execute(
            "SELECT status, attempts, locked_by IS NOT NULL FROM runs WHERE id = %s", [run_id]
        ).fetchone()
        release.touch()
        wait_for(lambda: count(conn, "status = 'succeeded'") == 1, 30, what="succeeded")
    finally:
        for daemon in cluster.daemons:
            daemon.signal(signal.SIGTERM)
        for daemon in cluster.daemons:
            daemon.wait(40)
    spans = _spans(cluster)
    assert set(spans) == {(run_id, 1), (run_id, 2)}, spans
    assert spans[run_id, 2][0] >= spans[run_id, 1][1], (
        f"attempt 2 started {spans[run_id, 1][1] - spans[run_id, 2][0]:.2f}s before "
        "attempt 1's handler returned"
    )
    assert during == ("running", 1, True), during
    assert shown.code == 0 and "#1 stopping (timed out)" in shown.text, shown.text
    history = conn.execute(
        "SELECT attempt, outcome, error_type FROM attempts WHERE run_id = %s ORDER BY attempt",
        [run_id],
    ).fetchall()
    assert history == [(1, "failed", "timeout"), (2, "succeeded", None)], history


def test_a_stop_writes_the_timeout_of_a_handler_that_never_returns(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """SIGTERM while a run past its timeout is held for its handler (60 s, deaf to
    ctx.cancelled): the drain waits worker.shutdown_grace for it like any handler, then,
    the thread dying with the process, writes the attempt as the timeout's failure (not
    released, not left running for the reaper), and the daemon exits 0."""
    daemon = cluster.start(
        cluster.config(
            HELD_TIMEOUT_TYPE.format(handler="work", limits="max_running = 1"),
            threads=1,
            heartbeat="500ms",
            grace="1s",
        )
    )
    [run_id] = enqueue(conn, [("work", {"sleep": 60.0})], max_attempts=2)
    wait_for(
        lambda: count(conn, "status = 'running' AND error_type = 'timeout'") == 1,
        20,
        what="timed out, still held",
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(30) == 0, daemon.log()
    row = conn.execute(
        "SELECT status, error_type, last_error, locked_by FROM runs WHERE id = %s", [run_id]
    ).fetchone()
    assert row == ("failed", "timeout", "timed out after 2s", None), row
    history = conn.execute(
        "SELECT attempt, outcome, error_type FROM attempts WHERE run_id = %s", [run_id]
    ).fetchall()
    assert history == [(1, "failed", "timeout")], history


def test_a_stop_writes_that_timeout_as_its_last_act_so_no_retry_runs_beside_the_handler(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """Torture seed 4324, run 2997: the drain wrote the timeout's failure of a handler that
    never returned at its end, with the retry due after its backoff (0 s here); another
    daemon claimed the retry and ran it while the first copy still ran, until its process
    ended. The failure is now the process's last write, its retry due 2 s later at the
    soonest: the second copy starts after the first daemon has exited."""
    config = cluster.config(
        HELD_TIMEOUT_TYPE.format(handler="work", limits=""),
        threads=1,
        heartbeat="500ms",
        grace="1s",
        poll_interval="100ms",
    )
    stopping = cluster.start(config)
    [run_id] = enqueue(conn, [("work", {"sleep": 60.0})], max_attempts=3)
    wait_for(
        lambda: count(conn, "status = 'running' AND error_type = 'timeout'") == 1,
        20,
        what="timed out, still held",
    )
    other = cluster.start(config)
    stopping.signal(signal.SIGTERM)
    assert stopping.wait(30) == 0, stopping.log()
    exited = time.time()
    assert '"released_at_exit"' in stopping.log()

    def retry_starts() -> list[float]:
        return [
            r["t"]
            for r in cluster.records()
            if r["event"] == "start" and r["run_id"] == run_id and r["attempt"] == 2
        ]

    [second] = wait_for(retry_starts, 20, what="the retry started on the other daemon")
    assert second > exited, f"the retry started {exited - second:.2f}s before the first exited"
    history = conn.execute(
        "SELECT attempt, outcome, error_type FROM attempts WHERE run_id = %s AND attempt = 1",
        [run_id],
    ).fetchall()
    assert history == [(1, "failed", "timeout")], history
    other.signal(signal.SIGTERM)
    other.wait(30)
