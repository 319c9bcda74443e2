"""The operator's read queries against a large runs table: their plans must not scan runs."""

from __future__ import annotations

from typing import Any

import pytest

from pgtick import db, sqlfile

ROWS = 200_000


def _plan(conn: db.Connection, name: str, params: dict[str, Any]) -> str:
    statement = sqlfile.query(name).as_string(conn)
    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))


def _listing(**filters: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "statuses": None,
        "job_type": None,
        "schedule": None,
        "since": None,
        "before": None,
        "limit": 51,
    }
    params.update(filters)
    return params


@pytest.fixture
def big(conn: db.Connection) -> db.Connection:
    """Mostly succeeded runs, a few hundred dead ones, some queued: a table after months."""
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, started_at, finished_at)"
        " SELECT 't' || g % 7, CASE WHEN g % 997 = 0 THEN 'dead' ELSE 'succeeded' END, 1, 10,"
        "        now() - g * interval '1 second', now() - g * interval '1 second'"
        f" FROM generate_series(1, {ROWS}) g"
    )
    conn.execute("INSERT INTO runs (job_type) SELECT 't1' FROM generate_series(1, 500)")
    conn.execute("ANALYZE runs")
    return conn


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("name", "filters"),
    [
        ("list_runs", {}),
        ("list_runs", {"before": ROWS // 2}),
        ("list_finished_runs", {"statuses": ["dead"]}),
        ("list_finished_runs", {"statuses": ["dead"], "before": ROWS // 2}),
        ("list_runs", {"statuses": ["queued"]}),
    ],
)
def test_run_listing_is_served_by_an_index(
    big: db.Connection, name: str, filters: dict[str, Any]
) -> None:
    plan = _plan(big, name, _listing(**filters))
    assert "Seq Scan on runs" not in plan, plan
    assert "Index" in plan, plan
    if name == "list_finished_runs":
        assert "runs_finished_idx" in plan, plan  # not a walk down the whole primary key
