"""The operator's verbs with ``--dsn`` at PgBouncer in transaction mode: each does its work
and says what it did, nothing left behind on the pooler's server connections."""

from __future__ import annotations

import psycopg

from tests.acceptance.cli import pgtick


def test_operator_verbs_work_through_pgbouncer(dsn: str, pooled_dsn: str) -> None:
    enqueued = pgtick(pooled_dsn, "enqueue", "report", "--payload", '{"n": 1}', "--key", "k1")
    assert enqueued.code == 0, enqueued.err
    run_id = enqueued.out[-1].strip()
    assert run_id.isdigit()
    # Every verb more than five times, past psycopg's default prepare threshold.
    for _ in range(6):
        again = pgtick(pooled_dsn, "enqueue", "report", "--key", "k1")
        assert (again.code, again.out[-1].strip()) == (0, run_id), again.err
        runs = pgtick(pooled_dsn, "runs", "--json")
        assert runs.code == 0 and run_id in runs.text, runs.err
        shown = pgtick(pooled_dsn, "show", run_id)
        assert shown.code == 0 and "report" in shown.text, shown.err
        status = pgtick(pooled_dsn, "status", "--json")
        # 5: "needs attention" (a due run and no daemon), the documented health-check code
        assert status.code == 5 and "report" in status.text, status.err
    cancelled = pgtick(pooled_dsn, "cancel", run_id)
    assert cancelled.code == 0, cancelled.err
    retried = pgtick(pooled_dsn, "retry", run_id)
    assert retried.code == 0, retried.err
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM pgtick.runs WHERE id = %s", [int(run_id)]).fetchone()
        assert row == ("queued",)
        # No pgtick session state was left on the server connections the pooler hands out.
        leaked = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND query ILIKE 'SET search_path%%'"
        ).fetchone()
        assert leaked == (0,)
