"""The operator's read queries against a large runs table: their plans must not scan runs."""

from __future__ import annotations

from typing import Any

import pytest

from pgtick.storage import db, sqlfile
from tests.integration import plans

ROWS = 200_000


def _plan(conn: db.Connection, name: str, params: dict[str, Any]) -> str:
    statement = sqlfile.query(name, conn.schema).as_string(conn)
    return plans.readable(
        conn, "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))
    )


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
    # A rare job type whose runs are spread over the whole id range.
    conn.execute(
        "UPDATE runs SET job_type = 'rare' WHERE id IN"
        f" (SELECT g * ({ROWS} / 50) FROM generate_series(1, 50) g)"
    )
    # Side-effect keys of many runs, as effect_once leaves them.
    conn.execute(
        "INSERT INTO effects (key, run_id) SELECT 'mail:' || g, g FROM generate_series(1, 100000) g"
    )
    conn.execute("ANALYZE runs")
    conn.execute("ANALYZE effects")
    return conn


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("name", "filters", "index"),
    [
        ("list_runs", {}, None),
        ("list_runs", {"before": ROWS // 2}, None),
        # the dead runs' own partitions only
        ("list_finished_runs", {"statuses": ["dead"]}, None),
        ("list_finished_runs", {"statuses": ["dead"], "before": ROWS // 2}, None),
        ("list_runs", {"statuses": ["queued"]}, None),
        # `runs --type T` for a rare type: its own rows in id order, not the primary key
        # filtered row by row (migration 0004)
        ("list_runs", {"job_type": "rare"}, "runs_job_type_id_idx"),
        ("list_runs", {"job_type": "rare", "before": ROWS // 2}, "runs_job_type_id_idx"),
    ],
)
def test_run_listing_is_served_by_an_index(
    big: db.Connection, name: str, filters: dict[str, Any], index: str | None
) -> None:
    plan = _plan(big, name, _listing(**filters))
    assert "Seq Scan on runs" not in plan, plan
    if filters.get("statuses") == ["dead"]:
        assert "runs_succeeded" not in plan, plan
    if index is not None:
        assert index in plan, plan


@pytest.mark.timeout(300)
def test_rare_job_type_page_reads_few_pages(big: db.Connection) -> None:
    """Measured, not only planned: a page of a rare type reads a handful of pages."""
    statement = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sqlfile.query(
        "list_runs", big.schema
    ).as_string(big)
    row = big.execute(statement, _listing(job_type="rare")).fetchone()
    assert row is not None
    top = row[0][0]["Plan"]
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 200, top


@pytest.mark.timeout(300)
def test_show_reads_effect_keys_through_an_index(big: db.Connection) -> None:
    plan = _plan(big, "effect_keys", {"run_id": 4242})
    assert "effects_run_id_idx" in plan, plan
    assert "Seq Scan on effects" not in plan, plan
