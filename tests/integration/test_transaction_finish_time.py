"""A success committed through ``ctx.transaction()`` is recorded as finished when it was
written, not when the handler's transaction began. ``succeed`` wrote ``finished_at = now()``,
the transaction's start, inside the handler's transaction: a handler that worked 5 s in it
showed as 10 ms, and a transaction longer than the retention plus a period routed the row to
a period already dropped."""

from __future__ import annotations

from datetime import timedelta

from pgtick.config import JobTypeConfig
from pgtick.core import handlers
from pgtick.storage import db
from pgtick.storage.store import ClaimType, NewRun, RunStore

TX = [ClaimType("tx", 60.0, 3)]
WORK_SECONDS = 2.0


def _handler(ctx: handlers.JobContext, payload: object) -> None:
    with ctx.transaction() as c:
        c.execute("SELECT 1")  # the transaction has begun: now() is fixed from here
        ctx.cancelled.wait(WORK_SECONDS)  # nobody sets it: the handler's work in the transaction


def test_a_success_committed_through_ctx_transaction_finishes_when_written(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("tx"))
    [claimed] = store.claim("w", TX, 1)
    jt = handlers.JobType(JobTypeConfig(name="tx"), 60.0, fn=_handler)
    ctx = handlers.claimed_context(claimed, store, "w", handlers._Unguarded())
    assert handlers.execute(ctx, jt, {}).kind == "succeeded"

    run = store.get_run(run_id)
    assert run is not None and run.status == "succeeded"
    assert run.started_at is not None and run.finished_at is not None
    assert run.finished_at - run.started_at >= timedelta(seconds=WORK_SECONDS)
    assert run.updated_at == run.finished_at
    [attempt] = store.get_attempts(run_id)
    assert attempt.outcome == "succeeded" and attempt.finished_at is not None
    assert attempt.finished_at - attempt.started_at >= timedelta(seconds=WORK_SECONDS)
    assert attempt.finished_at == run.finished_at
