"""Issue 18, "Must show" 4: retention drops partitions while runs finish. Two claimers drain
a backlog, claiming and finishing as a daemon's workers do (succeeded, failed then retried,
dead), while retention passes drop 24 hours of old partitions one by one, each drop waiting for
the finishes that hold the parent and the finishes queued behind it waiting for the drop. At
the end: every run of the backlog ran to its end once (one attempt per claim, none lost, none
twice), every old partition is gone, and no claimer saw an error."""

from __future__ import annotations

import threading
import time

import pytest
from psycopg.types.json import Jsonb

from pgtick.config import RetentionConfig
from pgtick.errors import DatabaseError
from pgtick.storage import db
from pgtick.storage.store import ClaimType, Failure, NewRun, RunStore
from tests.integration import partitions

BACKLOG = 3000
TOP_UP = 20  # runs enqueued with each retention step until the old partitions are gone
OLD_HOURS = 24  # old partitions per parent, one an hour, 48 to 24 hours ago
OLD_RUNS_PER_HOUR = 50
PARENTS = ("runs_succeeded", "runs_dead", "attempts_succeeded", "attempts_ended")
JOB = ClaimType("mail", 60.0, 2)
STEP = "SELECT action, table_name FROM maintain_partitions(%s)"


def _old_history(conn: db.Connection) -> list[str]:
    """An hour's partition per parent for each of the hours 48 to 24 ago, with runs (and
    their attempts) that finished in it."""
    names = []
    for hour in range(2 * OLD_HOURS, OLD_HOURS, -1):
        for parent in PARENTS:
            names.append(partitions.past(conn, parent, (hour, hour - 1)))
        conn.execute(
            "WITH old AS (INSERT INTO runs (job_type, status, attempts, finished_at)"
            " SELECT 'old', CASE WHEN g %% 5 = 0 THEN 'dead' ELSE 'succeeded' END, 1,"
            "        date_trunc('hour', now()) - %(hour)s * interval '1 hour'"
            "        + g * interval '1 second'"
            " FROM generate_series(1, %(n)s) g RETURNING id, status, finished_at)"
            " INSERT INTO attempts_history (run_id, attempt, worker_id, started_at, finished_at,"
            " outcome) SELECT id, 1, 'w', finished_at, finished_at,"
            "        CASE WHEN status = 'dead' THEN 'failed' ELSE 'succeeded' END FROM old",
            {"hour": hour, "n": OLD_RUNS_PER_HOUR},
        )
    return names


def _drain(store: RunStore, worker: str, errors: list[str]) -> None:
    """Claim and finish until nothing is left: a run whose id ends in 7 fails (retried once,
    then dead), the others succeed."""
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 2:
        try:
            claimed = store.claim(worker, [JOB], 20)
            if not claimed:
                time.sleep(0.01)
                continue
            idle_since = time.monotonic()
            failing = [r for r in claimed if r.id % 10 == 7]
            store.finish(
                worker,
                [(r.id, r.attempt) for r in claimed if r.id % 10 != 7],
                [Failure(r.id, r.attempt, "boom", "RuntimeError", "boom", 0.0) for r in failing],
            )
        except DatabaseError as exc:
            errors.append(str(exc))
            return


@pytest.mark.timeout(300)
def test_retention_drops_partitions_while_runs_finish(store: RunStore, conn: db.Connection) -> None:
    old = _old_history(conn)
    ids = store.enqueue_many([NewRun("mail") for _ in range(BACKLOG)])
    retention = Jsonb(RetentionConfig(*[24 * 3600.0] * 4).by_status())

    errors: list[str] = []
    claimers = [threading.Thread(target=_drain, args=(store, f"w{i}", errors)) for i in range(2)]
    dropped: list[str] = []
    for claimer in claimers:
        claimer.start()
    # Retention one step at a time (a step creates or drops one partition, in a transaction
    # of its own), while the claimers drain; then the rest. Until the last old partition is
    # dropped, each step also enqueues a few runs more: the claimers never run dry first,
    # however fast they drain on this machine (a faster drain had left half the drops to the
    # claimers' idle tail).
    steps = during = 0
    while True:
        step = conn.execute(STEP, [retention]).fetchall()
        if not step and not any(c.is_alive() for c in claimers):
            break
        steps += 1
        dropped += [table for action, table in step if action == "dropped"]
        if any(c.is_alive() for c in claimers):
            during = len(dropped)
            if len(dropped) < len(old):
                ids += store.enqueue_many([NewRun("mail") for _ in range(TOP_UP)])
        time.sleep(0.02)
    for claimer in claimers:
        claimer.join()

    assert errors == []
    assert sorted(dropped) == sorted(old)
    assert steps > len(old)  # created today's and the next half hour's as well
    assert during == len(old), during  # all of them while the claimers finished runs
    assert conn.execute("SELECT count(*) FROM runs WHERE job_type = 'old'").fetchone() == (0,)
    states = dict(
        conn.execute(
            "SELECT status, count(*) FROM runs WHERE id = ANY(%s) GROUP BY status", [ids]
        ).fetchall()
    )
    failing = sum(1 for i in ids if i % 10 == 7)
    assert states == {"succeeded": len(ids) - failing, "dead": failing}
    # One attempt per claim: two for the runs that failed (max_attempts 2), one for the rest,
    # each closed with its outcome.
    attempts = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE outcome IS NULL) FROM attempts"
        " WHERE run_id = ANY(%s)",
        [ids],
    ).fetchone()
    assert attempts == (len(ids) + failing, 0)
