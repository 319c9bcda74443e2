"""What a Python handler logs is kept as its attempt's output also when the handler commits its
success with ``ctx.transaction()``. The capture's final flush runs after the handler returned,
by which time that transaction has moved the run to ``succeeded``, and the write's guard (the
run held, running or cancelled) refused it: every line since the last periodic flush (for a
handler shorter than a second: all of them) was lost."""

from __future__ import annotations

import logging

from pgtick.config import JobTypeConfig
from pgtick.core import handlers
from pgtick.core.output import Flusher
from pgtick.storage import db
from pgtick.storage.store import ClaimType, NewRun, RunStore
from pgtick.surfaces import operations

TX = [ClaimType("tx", 60.0, 3)]
app_log = logging.getLogger("app.orders")


def _handler(ctx: handlers.JobContext, payload: object) -> None:
    app_log.warning("before the transaction")
    with ctx.transaction() as c:
        c.execute("SELECT 1")
        app_log.warning("inside the transaction")
    app_log.warning("after the commit")


def test_output_of_a_handler_that_commits_through_ctx_transaction_is_kept(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("tx"))
    [claimed] = store.claim("w", TX, 1)
    flusher = Flusher(store, "w")  # its periodic thread is not started: a sub-second handler
    jt = handlers.JobType(JobTypeConfig(name="tx"), 60.0, fn=_handler)
    ctx = handlers.claimed_context(claimed, store, "w", handlers._Unguarded(), flusher)
    outcome = handlers.execute(ctx, jt, {})
    assert outcome.kind == "succeeded"
    assert store.get_run(run_id).status == "succeeded"
    texts = [x.text for x in operations.run_output(store, run_id)]
    assert texts == [
        "warning before the transaction",
        "warning inside the transaction",
        "warning after the commit",
    ]
