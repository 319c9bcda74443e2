"""The statements of the hot path run on their prepared statement's generic plan, never a
custom one. Under ``plan_cache_mode = auto`` PostgreSQL plans a prepared statement afresh for
its first five executions, and again whenever a re-plan (after autoanalyze or a partition
created or dropped) finds the generic plan dearer than the custom ones: measured under
``bench soak``, the claim was then planned at every call for the rest of the run, 0.8 ms of
planning for 0.2 ms of execution, and the daemon's claim p99 stepped from about 2.5 to 5-6 ms.
planner_hints sets ``force_generic_plan`` for the statement that follows it; checked here for
every statement of the hot path (as test_no_jit.py does), on a connection of the worker
pool's kind (prepared statements on), through ``base.by_index``, the path the store sends
them by. Without the hint the first executions are custom plans."""

from __future__ import annotations

import pytest

from pgtick.storage import db
from pgtick.storage.base import by_index
from tests.conftest import SCHEMA
from tests.integration import plans

CALLS = 12  # well past psycopg's prepare threshold and PostgreSQL's five custom plans


@pytest.mark.parametrize("name", sorted(plans.HOT_PATH))
def test_a_hot_path_statement_runs_on_its_generic_plan(dsn: str, name: str) -> None:
    pool = db.make_pool(dsn, SCHEMA, size=1, name="pgtick-test", prepare=True)
    try:
        with pool.connection() as conn:
            for _ in range(CALLS):
                by_index(conn, name, plans.HOT_PATH[name])
            rows = conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE NOT from_sql"
            ).fetchall()
    finally:
        pool.close()
    statement = [r for r in rows if "set_config" not in r[0]]  # the hints are prepared too
    assert statement, f"{name} was never prepared: {rows}"
    for text, generic, custom in statement:
        assert custom == 0, f"{name}: {custom} custom plans ({generic} generic): {text[:80]}"
        assert generic >= 1, f"{name}: no generic plan: {text[:80]}"
