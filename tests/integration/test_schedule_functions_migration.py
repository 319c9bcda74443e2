"""Migration 0028 replaces create_schedule() and update_schedule() (two more arguments): a role
that could execute the earlier ones can execute these, PUBLIC still cannot, and a call of the
earlier signature by that role still works."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtick.storage import migrate

SIGNATURE = (
    "{fn}(text, text, text, text, jsonb, text, integer, text, text, float8, integer, integer,"
    " text, text{extra})"
)


def test_0028_keeps_who_may_manage_schedules(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = migrate.available()
    before = [m for m in shipped if m.version < "0028"]
    monkeypatch.setattr(migrate, "available", lambda: before)
    migrate.migrate(empty_dsn, "pgtick")
    app, other = f"app_{uuid.uuid4().hex[:8]}", f"other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(empty_dsn, autocommit=True) as admin:
        for role in (app, other):
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(
            sql.SQL("GRANT USAGE ON SCHEMA pgtick TO {}, {}").format(
                sql.Identifier(app), sql.Identifier(other)
            )
        )
        # as 0022 grants them: to a role that may write runs
        admin.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE ON pgtick.runs TO {}").format(sql.Identifier(app))
        )
        for fn in ("create_schedule", "update_schedule"):
            admin.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION pgtick.{} TO {}").format(
                    sql.SQL(SIGNATURE.format(fn=fn, extra="")), sql.Identifier(app)
                )
            )
        monkeypatch.setattr(migrate, "available", lambda: shipped)
        applied = migrate.migrate(empty_dsn, "pgtick")
        assert applied[0].startswith("0028_"), applied
        for fn in ("create_schedule", "update_schedule"):
            new = f"pgtick.{SIGNATURE.format(fn=fn, extra=', jsonb, jsonb')}"
            can = admin.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'),"
                " has_function_privilege(%s, %s, 'EXECUTE')",
                (app, new, other, new),
            ).fetchone()
            assert can == (True, False), (fn, can)
    try:
        with psycopg.connect(make_conninfo(empty_dsn, user=app), autocommit=True) as conn:
            conn.execute(
                "SELECT pgtick.create_schedule('t', 'report', '0 3 * * *', 'UTC', '{}',"
                " 'latest', 100, 'skip', 'hold', 0, NULL, 0, 'app', 'sql')"
            )
            assert conn.execute(
                "SELECT pgtick.update_schedule('t', cron => '0 4 * * *')"
            ).fetchone() == (True,)
    finally:
        with psycopg.connect(empty_dsn, autocommit=True) as admin:
            for role in (app, other):
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
