"""The SQL the runbooks tell an operator to paste: every block runs against a migrated schema,
and the vacuum runbook's first query names the session that holds the horizon."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from .contract import NOT_MIGRATED_YET
from .docsite import runbook_pages

_SQL_BLOCK = re.compile(r"^ *```sql\n(.*?)^ *```", flags=re.MULTILINE | re.DOTALL)


def sql_blocks() -> list[tuple[str, str]]:
    """(page name, statement) for every ```sql block of the runbooks."""
    return [
        (page.name, block.strip())
        for page in runbook_pages()
        for block in _SQL_BLOCK.findall(page.read_text())
    ]


def existing_columns(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'pgtick'"
    ).fetchall()
    return {f"{table}.{column}" for table, column in rows}


def test_the_runbooks_have_sql_to_run() -> None:
    pages = {page for page, _ in sql_blocks()}
    assert len(pages) >= 8, pages
    assert "vacuum-blocked.md" in pages


@pytest.mark.timeout(60)
def test_every_runbook_query_runs_against_the_migrated_schema(dsn: str) -> None:
    """Placeholders such as 'TYPE' and 'NAME' are string literals, so each block runs as
    written. A column the contract requires but no migration adds yet may be missing."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        columns = existing_columns(conn)
        arrived = NOT_MIGRATED_YET & columns
        assert not arrived, f"{arrived} exist now: remove them from NOT_MIGRATED_YET"
        for page, statement in sql_blocks():
            try:
                conn.execute(statement).fetchall()
            except psycopg.errors.UndefinedColumn as exc:
                pending = {c for c in NOT_MIGRATED_YET if c.split(".")[1] in str(exc)}
                assert pending, f"{page}: {exc}\n{statement}"


@pytest.mark.timeout(60)
def test_the_vacuum_runbook_finds_a_session_holding_a_snapshot(dsn: str) -> None:
    """An open REPEATABLE READ transaction pins the horizon; the runbook's first query lists
    it first."""
    first = next(statement for page, statement in sql_blocks() if page == "vacuum-blocked.md")
    assert "pg_stat_activity" in first
    with (
        psycopg.connect(dsn, autocommit=True) as holder,
        psycopg.connect(dsn, autocommit=True) as operator,
    ):
        holder_pid, operator_pid = holder.info.backend_pid, operator.info.backend_pid
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgtick.runs")
        # The operator's own query holds a snapshot too, a younger one: listed after.
        rows = operator.execute(first).fetchall()
        holder.execute("ROLLBACK")
    assert [row[0] for row in rows[:2]] == [holder_pid, operator_pid], rows
