"""The trace a run was enqueued in, stored with it (migration 0018): every enqueue path takes
it, every earlier call of enqueue() still works, the claim hands it back in the same row, and
the migration keeps who may enqueue."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from psycopg import sql

import pgtick
from pgtick.observability import tracecontext
from pgtick.storage import db, migrate
from pgtick.storage.store import ClaimType, NewRun, RunStore
from tests.conftest import SCHEMA
from tests.unit.test_tracecontext import CASES, TP

OTHER_TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
# enqueue() as the head migrations leave it (0025 added on_success and on_dead, keeping who
# may execute it the same way 0018 does).
ENQUEUE_8 = "enqueue(text, jsonb, timestamptz, text, integer, integer, text, text, jsonb, jsonb)"


def _traceparent(conn: db.Connection, run_id: int) -> str | None:
    row = conn.execute("SELECT traceparent FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_every_earlier_call_of_enqueue_still_works_and_a_traceparent_comes_last(
    conn: db.Connection,
) -> None:
    calls = {
        "SELECT enqueue('a')": None,
        "SELECT enqueue('a', '{}', NULL, NULL, NULL, NULL, NULL)": None,
        "SELECT enqueue(job_type => 'a', priority => 3, concurrency_key => 'k')": None,
        "SELECT enqueue('a', '{}', NULL, NULL, NULL, NULL, NULL, %(tp)s)": TP,
        "SELECT enqueue('a', traceparent => %(tp)s)": TP,
        "SELECT enqueue('a', traceparent => 'garbage')": None,  # W3C: ignored, never refused
    }
    for statement, stored in calls.items():
        row = conn.execute(statement, {"tp": TP}).fetchone()
        assert row is not None
        assert _traceparent(conn, int(row[0])) == stored, statement


def test_the_sql_function_stores_what_the_python_check_stores(conn: db.Connection) -> None:
    for value, stored in CASES:
        row = conn.execute("SELECT valid_traceparent(%s)", (value,)).fetchone()
        assert row == (stored,), value
        assert tracecontext.valid(value) == stored


def test_the_claim_hands_back_each_run_s_traceparent_in_its_row(store: RunStore) -> None:
    ids = store.enqueue_many(
        [
            NewRun("traced", {"n": 0}, traceparent=TP),
            NewRun("traced", {"n": 1}),
            NewRun("traced", {"n": 2}, traceparent="00-zz"),
        ]
    )
    ids.append(store.enqueue(NewRun("traced", {"n": 3}, traceparent=OTHER_TP)))
    claimed = store.claim("w", [ClaimType("traced", 60.0, 3)], 10)
    by_id = {run.id: run.traceparent for run in claimed}
    assert by_id == {ids[0]: TP, ids[1]: None, ids[2]: None, ids[3]: OTHER_TP}


def test_python_enqueue_stores_the_caller_s_current_span_or_the_one_it_is_given(
    dsn: str, conn: db.Connection
) -> None:
    tracer = TracerProvider().get_tracer("test")  # not the global one: this process's own
    with psycopg.connect(dsn) as app:
        outside = pgtick.enqueue(app, "a")
        with tracer.start_as_current_span("request") as span:
            inside = pgtick.enqueue(app, "a")
            given = pgtick.enqueue(app, "a", traceparent=OTHER_TP)
            bad = pgtick.enqueue(app, "a", traceparent="nonsense")
        app.commit()
    c = span.get_span_context()
    assert _traceparent(conn, outside) is None
    assert _traceparent(conn, inside) == tracecontext.format_traceparent(
        c.trace_id, c.span_id, int(c.trace_flags)
    )
    assert _traceparent(conn, given) == OTHER_TP
    assert _traceparent(conn, bad) is None


@pytest.fixture
def roles(empty_dsn: str) -> Iterator[list[str]]:
    names = [f"pgtick_tc_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with db.connect_raw(empty_dsn) as admin:
        admin.autocommit = True
        for role in names:
            admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        try:
            yield names
        finally:
            for role in names:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("locked_down", [True, False])
def test_the_migration_keeps_who_may_enqueue(
    empty_dsn: str, roles: list[str], monkeypatch: pytest.MonkeyPatch, locked_down: bool
) -> None:
    """enqueue() is created anew (its signature changes): a database that revoked EXECUTE
    from PUBLIC and granted it to the application's role keeps exactly that, and one that
    left PostgreSQL's default keeps EXECUTE for everyone; no `pgtick grants` needed."""
    granted, other = roles
    shipped = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [m for m in shipped if m.version < "0018"])
    migrate.migrate(empty_dsn, SCHEMA)
    monkeypatch.undo()
    with db.connect(empty_dsn, SCHEMA) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(SCHEMA)))
        if locked_down:
            old = "enqueue(text, jsonb, timestamptz, text, integer, integer, text)"
            conn.execute(f"REVOKE EXECUTE ON FUNCTION {old} FROM PUBLIC")
            conn.execute(
                sql.SQL(f"GRANT EXECUTE ON FUNCTION {old} TO {{}}").format(sql.Identifier(granted))
            )
    assert "0018_store_trace_context" in migrate.migrate(empty_dsn, SCHEMA)
    with db.connect(empty_dsn, SCHEMA) as conn:
        fn = f"{SCHEMA}.{ENQUEUE_8}"
        may = {
            role: conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'),"
                " has_function_privilege(%s, %s, 'EXECUTE')",
                (role, fn, role, f"{SCHEMA}.valid_traceparent(text)"),
            ).fetchone()
            for role in roles
        }
        assert may == {granted: (True, True), other: (not locked_down, not locked_down)}
        overloads = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'enqueue'"
            " AND pronamespace = %s::regnamespace",
            (SCHEMA,),
        ).fetchone()
        assert overloads == (1,)  # one enqueue: a call by position is never ambiguous
