"""Migration 0029 moves the schedules' health out of the metrics query into
schedule_health(), planned once per connection: a role that could enqueue (the roles `pgtick
grants` gave EXECUTE before it existed) can call it, PUBLIC cannot where the database gives
PUBLIC no EXECUTE, and it answers as the query did (tests/integration/test_metrics_queries.py
judges the answers)."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtick.storage import migrate

ENQUEUE = (
    "pgtick.enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)"
)
HEALTH = "pgtick.schedule_health(text[], timestamptz[])"


def test_0029_lets_whoever_may_enqueue_read_schedule_health(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [m for m in shipped if m.version < "0029"])
    migrate.migrate(empty_dsn, "pgtick")
    app, other = f"app_{uuid.uuid4().hex[:8]}", f"other_{uuid.uuid4().hex[:8]}"
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            for role in (app, other):
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                admin.execute(
                    sql.SQL("GRANT USAGE ON SCHEMA pgtick TO {}").format(sql.Identifier(role))
                )
                admin.execute(
                    sql.SQL("GRANT SELECT ON pgtick.runs, pgtick.schedules TO {}").format(
                        sql.Identifier(role)
                    )
                )
            # A database whose functions PUBLIC may not execute; `pgtick grants` gave app its.
            admin.execute(sql.SQL(f"REVOKE EXECUTE ON FUNCTION {ENQUEUE} FROM PUBLIC"))
            admin.execute(
                sql.SQL(f"GRANT EXECUTE ON FUNCTION {ENQUEUE} TO {{}}").format(sql.Identifier(app))
            )
            admin.execute("SELECT pgtick.create_schedule('nightly', 'report', '0 3 * * *', 'UTC')")
            monkeypatch.setattr(migrate, "available", lambda: shipped)
            applied = migrate.migrate(empty_dsn, "pgtick")
            assert applied[0].startswith("0029_"), applied
            can = admin.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'),"
                " has_function_privilege(%s, %s, 'EXECUTE')",
                (app, HEALTH, other, HEALTH),
            ).fetchone()
            assert can == (True, False)
        with psycopg.connect(make_conninfo(empty_dsn, user=app), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pgtick.schedule_health(ARRAY['nightly', 'gone'], ARRAY[NULL, now()]"
                "::timestamptz[])"
            ).fetchone()
            # The configured schedule without a row is left out; no run, no due occurrence.
            assert row == ([["nightly", False, None, None]],)
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            for role in (app, other):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
