"""The keyset claim starts each scan just below the last run it claimed; runs that land behind
that bound must still start at once: a run enqueued due in the past, and a run enqueued in a
transaction that committed seconds after its run_at was taken (while the daemon went on
claiming later runs); a run a claim skipped because another transaction held it, within the
look-back interval of that transaction's end."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg

from tests.dbhelp import Connection, NewRun, Runs, connect

from .conftest import Cluster, wait_for

# Well under the 2 s periodic rescan and the 5 s poll: only a prompt rescan meets it.
PROMPT_SECONDS = 1.0
LOOK_SECONDS = 5.0  # how often a daemon's claim looks for due runs behind its bounds


def _started_at(cluster: Cluster, run_id: int) -> float:
    [record] = wait_for(
        lambda: [r for r in cluster.records() if r["run_id"] == run_id], 10, what=f"run {run_id}"
    )
    return float(record["t"])


def _advance_the_bound(cluster: Cluster, store: Runs, n: int = 5) -> None:
    """Runs due now, claimed and run: the daemon's bound moves up to about now."""
    ids = store.enqueue_many([NewRun("record") for _ in range(n)])
    for run_id in ids:
        _started_at(cluster, run_id)


def test_a_run_enqueued_due_an_hour_ago_starts_at_once(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    cluster.start()
    _advance_the_bound(cluster, store)
    now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    enqueued = time.time()
    run_id = store.enqueue(NewRun("record", run_at=now - timedelta(hours=1)))
    assert _started_at(cluster, run_id) - enqueued < PROMPT_SECONDS


def test_a_run_committed_long_after_its_run_at_starts_at_once(
    cluster: Cluster, store: Runs, dsn: str
) -> None:
    cluster.start()
    _advance_the_bound(cluster, store)
    with psycopg.connect(dsn) as app:  # the application's own transaction
        app.execute("SET search_path TO pgtick")
        [(late,)] = app.execute("SELECT enqueue('record', '{\"late\": true}')").fetchall()
        time.sleep(1.5)  # the run's run_at is now() of this transaction: 1.5 s ago
        _advance_the_bound(cluster, store)  # meanwhile the daemon claims later runs
        app.commit()
        committed = time.time()
    assert _started_at(cluster, late) - committed < PROMPT_SECONDS


def test_runs_behind_the_bound_start_at_once_through_many_rounds(
    cluster: Cluster, store: Runs
) -> None:
    """Past-due runs interleaved with current ones, round after round: none waits."""
    cluster.start()
    with connect(store.dsn) as conn:
        for _ in range(5):
            _advance_the_bound(cluster, store, 3)
            now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            enqueued = time.time()
            run_id = store.enqueue(NewRun("record", run_at=now - timedelta(minutes=10)))
            assert _started_at(cluster, run_id) - enqueued < PROMPT_SECONDS


def test_a_late_commit_amid_a_steady_stream_starts_at_once(
    cluster: Cluster, store: Runs, dsn: str
) -> None:
    """With runs claimed every few ms, an empty claim after a NOTIFY says nothing (another claim
    just took what it announced); the run's own ``!due`` NOTIFY, delivered at its commit,
    lowers the bound to it."""
    cluster.start()
    stop = threading.Event()

    def stream() -> None:
        while not stop.wait(0.01):
            store.enqueue(NewRun("record", {"stream": True}))

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        with psycopg.connect(dsn) as app:
            app.execute("SET search_path TO pgtick")
            [(late,)] = app.execute("SELECT enqueue('record', '{\"late\": true}')").fetchall()
            time.sleep(2.5)  # the stream's runs move the bound past this run's run_at
            app.commit()
            committed = time.time()
        assert _started_at(cluster, late) - committed < PROMPT_SECONDS
    finally:
        stop.set()
        streamer.join()


def test_a_run_skipped_while_another_transaction_held_it_is_found_by_a_look_back(
    cluster: Cluster, store: Runs, dsn: str
) -> None:
    """A claim skips a run another transaction holds locked (another daemon's claim); when
    that transaction rolls back, nothing announces the run, which is behind the bound by
    then. A claim's look back, where the claims passed, finds it within its 5 s."""
    cluster.start()
    stop = threading.Event()

    def stream() -> None:
        while not stop.wait(0.01):
            store.enqueue(NewRun("record", {"stream": True}))

    with connect(store.dsn) as conn:
        now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    held = store.enqueue(NewRun("record", {"held": True}, run_at=now + timedelta(seconds=1)))
    streamer = threading.Thread(target=stream)
    with psycopg.connect(dsn) as other:
        other.execute("SELECT id FROM pgtick.runs WHERE id = %s FOR UPDATE", [held])
        streamer.start()
        try:
            time.sleep(3.0)  # due, skipped, and passed by the claims of the stream
            other.rollback()
            released = time.time()
            assert _started_at(cluster, held) - released < LOOK_SECONDS + PROMPT_SECONDS
        finally:
            stop.set()
            streamer.join()
