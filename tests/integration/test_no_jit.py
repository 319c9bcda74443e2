"""The statements of the hot path are never JIT-compiled. They are sent after planner_hints,
which disables sequential scans and sorts for them; before PostgreSQL 18 each disabled plan
node adds 1e10 to the plan's cost, far above ``jit_above_cost``, and a server built with LLVM
(Debian's and PGDG's packages; ``jit = on`` is the default) compiled, inlined and optimized
every claim and finish: 0.8-4.5 s a statement on PostgreSQL 15, the claimers of a race timed
out. The hints turn JIT off with the rest. Checked here with every JIT threshold at 0, so that
it holds whatever a server's thresholds are. The embedded server of the main pass has no JIT:
``tests/older_server.py`` (part of ``make test``) runs this on one that has."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from pgtick.storage import db, sqlfile
from tests.integration import plans

HOT_PATH: dict[str, dict[str, Any]] = plans.HOT_PATH | {
    "next_due": {"job_types": ["noop"], "lows": [None]},
}
THRESHOLDS = ("jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost")


@pytest.mark.parametrize("name", sorted(HOT_PATH))
def test_a_hot_path_statement_is_not_jit_compiled(conn: db.Connection, name: str) -> None:
    row = conn.execute("SELECT pg_jit_available()").fetchone()
    if not (row and row[0]):
        pytest.skip("this server has no JIT; tests/older_server.py runs this on one that has")
    statement = sqlfile.query(name, conn.schema)
    with conn.transaction(force_rollback=True):
        for threshold in THRESHOLDS:
            conn.execute(sql.SQL("SET LOCAL {} = 0").format(sql.Identifier(threshold)))
        conn.execute(sqlfile.query("planner_hints", conn.schema))
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) ") + statement
        found = conn.execute(explain, HOT_PATH[name]).fetchone()
    assert found is not None
    plan = found[0][0]
    assert "JIT" not in plan, f"{name} was JIT-compiled: {plan['JIT']}"
