"""One bad result does not stop a daemon recording every other result, and no payload kills a
handler thread. Before: a NUL in a command's stderr or an error message, a retry asked for
beyond the database's timestamps, or an error naming a file whose name is not UTF-8 made the
result writer's batch fail forever (or killed the writer), every later result joined it, and
the runs were reaped and ran again; a payload nested deeper than Python's recursion limit
killed the thread that read it."""

from __future__ import annotations

import signal

import pytest

from tests import dbhelp
from tests.acceptance.conftest import Cluster, Daemon, wait_for
from tests.acceptance.correctness import count, enqueue

NUL_TYPES = """
[job_types.nul_command]
command = ["/bin/sh", "-c", "printf 'bad\\\\000byte\\\\n' >&2; exit 3"]
max_attempts = 1

[job_types.nul_error]
handler = "hostile_jobs:nul_error"
max_attempts = 1

[job_types.retry_far]
handler = "hostile_jobs:retry_far"

[job_types.bad_filename]
handler = "hostile_jobs:bad_filename"
max_attempts = 1

[job_types.plain]
handler = "hostile_jobs:plain"
"""


def _stopped_once_written(daemon: Daemon, conn: dbhelp.Connection) -> int:
    """Wait for the results of the three plain runs and the bad one (dead) to be written, then
    stop the daemon (if it still runs); its exit code."""
    try:
        wait_for(
            lambda: count(conn, "status = 'succeeded'") == 3 and count(conn, "status = 'dead'"),
            10,
            what="results written",
        )
    finally:
        if daemon.proc.poll() is None:
            daemon.signal(signal.SIGTERM)
        code = daemon.wait(40)
    return code


def _outcome(conn: dbhelp.Connection, run_ids: list[int]) -> list[tuple[int, str]]:
    return conn.execute(
        "SELECT id, status FROM runs WHERE id = ANY(%s) ORDER BY id", [run_ids]
    ).fetchall()


@pytest.mark.parametrize(
    ("bad_type", "records"),
    [("nul_command", 0), ("nul_error", 1)],  # a NUL in a command's stderr, in an error message
)
def test_a_failure_holding_a_nul_does_not_stop_results_being_written(
    cluster: Cluster, conn: dbhelp.Connection, bad_type: str, records: int
) -> None:
    daemon = cluster.start(cluster.config(NUL_TYPES, threads=2))
    [bad] = enqueue(conn, [(bad_type, {})])
    wait_for(
        lambda: (
            "complete_failed" in daemon.log()
            or count(conn, "status = 'dead'")
            or (records and len(cluster.executions()) >= records)
        ),
        10,
        what="the bad run ended",
    )
    good = enqueue(conn, [("plain", {})] * 3)
    wait_for(lambda: len(cluster.executions()) >= 3 + records, 10, what="plain runs executed")
    code = _stopped_once_written(daemon, conn)
    assert _outcome(conn, [bad, *good]) == [(bad, "dead")] + [(g, "succeeded") for g in good]
    assert code == 0


def test_a_deeply_nested_payload_fails_its_run_and_keeps_the_thread(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """A payload PostgreSQL accepts but json.loads cannot (nesting deeper than Python's
    recursion limit) is parsed in the worker loop, outside handlers.execute: the thread
    dies, the daemon waits out its whole grace for it, then releases the run (attempt not
    counted) for the next daemon to die on."""
    daemon = cluster.start(cluster.config(NUL_TYPES, threads=1, grace="2s"))
    depth = 5000
    [deep] = [
        int(r[0])
        for r in conn.execute(
            "SELECT enqueue('plain', ('{\"a\": ' || repeat('[', %s) || repeat(']', %s) || '}')"
            "::jsonb, NULL, NULL, 1)",
            [depth, depth],
        ).fetchall()
    ]
    good = enqueue(conn, [("plain", {})] * 2)
    try:
        wait_for(
            lambda: count(conn, "status = 'succeeded'") == 2 or "loop_died" in daemon.log(),
            15,
            what="the plain runs after the deep one",
        )
    finally:
        daemon.signal(signal.SIGTERM)
        code = daemon.wait(40)
    died = [e for e in daemon.events() if e["event"] == "loop_died"]
    assert died == [], f"a worker thread died: {died}"
    assert code == 0
    assert _outcome(conn, [deep, *good]) == [(deep, "dead")] + [(g, "succeeded") for g in good]


def test_a_retry_asked_for_far_in_the_future_does_not_stop_results_being_written(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """Retry(after=...) is not bounded: now() + 1e13 s is out of timestamptz's range, the fail
    statement errors, and the completer retries that batch (growing with every new result)
    for ever."""
    daemon = cluster.start(cluster.config(NUL_TYPES, threads=2))
    [far] = enqueue(conn, [("retry_far", {"after": 1e13})])
    wait_for(lambda: len(cluster.executions()) >= 1, 10, what="run executed")
    good = enqueue(conn, [("plain", {})] * 3)
    wait_for(lambda: len(cluster.executions()) >= 4, 10, what="plain runs executed")
    try:
        wait_for(lambda: count(conn, "status = 'succeeded'") == 3, 10, what="results written")
    finally:
        daemon.signal(signal.SIGTERM)
        code = daemon.wait(40)
    assert _outcome(conn, good) == [(g, "succeeded") for g in good]
    assert _outcome(conn, [far])[0][1] in ("failed", "dead")
    assert code == 0


def test_a_handler_error_naming_a_non_utf8_file_does_not_kill_the_result_writer(
    cluster: Cluster, conn: dbhelp.Connection
) -> None:
    """str() of an OSError about a file whose name is not UTF-8 holds a lone surrogate
    (surrogateescape); psycopg cannot encode it and raises UnicodeEncodeError, which is not
    a psycopg.Error: the completer thread dies with the batch it was writing."""
    daemon = cluster.start(cluster.config(NUL_TYPES, threads=2))
    [bad] = enqueue(conn, [("bad_filename", {})])
    wait_for(lambda: len(cluster.executions()) >= 1, 10, what="run executed")
    good = enqueue(conn, [("plain", {})] * 3)
    code = _stopped_once_written(daemon, conn)
    died = [e for e in daemon.events() if e["event"] == "loop_died"]
    assert died == [], f"a daemon thread died: {died}"
    assert _outcome(conn, [bad, *good]) == [(bad, "dead")] + [(g, "succeeded") for g in good]
    assert code == 0
