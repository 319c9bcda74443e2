"""`pgtick prune --older-than D` removes terminal runs finished more than D ago with their
attempts and output, and keeps the attempts and output of the runs it keeps. Dropping whole
partitions, it dropped those too: of a run awaiting its retry (not terminal), and of a run
that succeeded a moment ago after a first attempt that failed more than D ago
(maintain_partitions gives ended attempts and output the longest cutoff and drops their
partitions by the attempts' own times, whatever became of their runs)."""

from __future__ import annotations

from datetime import timedelta

from pgtick.config import RetentionConfig
from pgtick.storage import db
from pgtick.storage.store import Chunk, ClaimType, Failure, NewRun, RunStore
from pgtick.surfaces import operations
from tests.integration import partitions

MAIL = [ClaimType("mail", 60.0, 5)]


def test_prune_older_than_keeps_the_attempts_and_output_of_runs_it_keeps(
    store: RunStore, conn: db.Connection
) -> None:
    # A partition of ended attempts and one of output, for 4 to 3 hours ago.
    partitions.past(conn, "attempts_ended", (4, 3))
    partitions.past(conn, "output_chunks", (4, 3))
    waiting, retried = store.enqueue_many([NewRun("mail"), NewRun("mail")])
    claimed = store.claim("w", MAIL, 2)
    for run in claimed:
        store.write_output(
            "w", run.id, 1, run.started_at, [Chunk(0, [(1, "stdout", f"attempt 1 of {run.id}")], 0)]
        )
    # Both fail their first attempt; `waiting` retries in an hour, `retried` at once.
    store.finish(
        "w",
        [],
        [
            Failure(
                r.id, r.attempt, "boom", "RuntimeError", "boom", 3600.0 if r.id == waiting else 0.0
            )
            for r in claimed
        ],
    )
    # ... and that first attempt was 3.5 hours ago (as if the retry had waited that long).
    conn.execute(
        "UPDATE attempts_history SET started_at = date_trunc('hour', now()) - interval '3.5 hours',"
        " finished_at = date_trunc('hour', now()) - interval '3.5 hours' + interval '1 second'"
    )
    conn.execute(
        "UPDATE output_chunks"
        " SET attempt_started_at = date_trunc('hour', now()) - interval '3.5 hours'"
    )
    # (and both runs were enqueued before it)
    conn.execute(
        "UPDATE runs SET created_at = date_trunc('hour', now()) - interval '3.6 hours'"
        " WHERE id = ANY(%s)",
        [[waiting, retried]],
    )
    # `retried` ran again just now, and succeeded.
    [again] = store.claim("w", MAIL, 1)
    assert again.id == retried
    store.succeed("w", [(retried, again.attempt)])
    assert store.get_run(waiting).status == "failed"  # awaiting its retry: not terminal

    def history() -> dict[int, tuple[list[tuple[int, str | None]], list[str]]]:
        return {
            run_id: (
                [(a.attempt, a.outcome) for a in store.get_attempts(run_id)],
                [x.text for x in operations.run_output(store, run_id)],
            )
            for run_id in (waiting, retried)
        }

    before = history()
    assert before[waiting] == ([(1, "failed")], [f"attempt 1 of {waiting}"])
    assert before[retried] == ([(1, "failed"), (2, "succeeded")], [f"attempt 1 of {retried}"])
    pruned = operations.prune(store, RetentionConfig(), older_than=timedelta(hours=1))
    assert pruned.total == 0  # no terminal run finished more than an hour ago

    assert history() == before
