"""Migration 0017 (runs_job_type_id_idx made partial, issue 42 finding 12) on an install with
runs in every kind of partition, while the application writes and an operator's transaction
on runs stays open: the application's writes are never held up behind the migration's locks,
the index ends valid and partial on every partition under its old names, and a file
interrupted half-way finishes when `migrate` runs again, a partition dropped meanwhile passed
over."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from pgtick.storage import migrate
from tests import dbhelp

VERSION = "0017"
PARTIAL = "(job_type, id) WHERE (job_type > ''::text)"


def _upto(monkeypatch: pytest.MonkeyPatch, dsn: str, before: str) -> list[migrate.Migration]:
    files = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [m for m in files if m.version < before])
    migrate.migrate(dsn, "pgtick")
    monkeypatch.setattr(migrate, "available", lambda: files)
    return files


def _fill(dsn: str) -> None:
    """Runs in the live partition and finished ones in today's, yesterday's and the default
    partitions of every terminal status."""
    with dbhelp.connect(dsn, "pgtick") as c:
        c.execute("SELECT enqueue('live') FROM generate_series(1, 500)")
        for status in ("succeeded", "dead", "cancelled", "skipped"):
            c.execute(
                "INSERT INTO runs (job_type, status, finished_at)"
                " SELECT 't' || g %% 7, %s, now() - (g %% 3) * interval '1 day'"
                " FROM generate_series(1, 3000) g",
                [status],
            )
            c.execute(
                "INSERT INTO runs (job_type, status, finished_at)"
                " VALUES ('old', %s, now() - interval '400 days')",
                [status],
            )


def _type_indexes(c: psycopg.Connection) -> list[tuple[str, str, str, bool]]:
    """(table, index, definition tail, valid) of every (job_type, id) index in runs' tree."""
    rows = c.execute(
        "SELECT t.relname, i.relname, pg_get_indexdef(x.indexrelid), x.indisvalid"
        " FROM pg_partition_tree('runs'::regclass) p"
        " JOIN pg_index x ON x.indrelid = p.relid"
        " JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = p.relid"
        " WHERE pg_get_indexdef(x.indexrelid) LIKE '%(job_type, id)%' ORDER BY 1, 2"
    ).fetchall()
    return [(t, i, d.split(" USING btree ")[1], v) for t, i, d, v in rows]


def _assert_partial_everywhere(dsn: str) -> None:
    with dbhelp.connect(dsn, "pgtick") as c:
        indexes = _type_indexes(c)
        tables = [
            r[0] for r in c.execute("SELECT relid::regclass::text FROM pg_partition_tree('runs')")
        ]
        leftovers = c.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'ddl_when_unlocked'"
        ).fetchone()
    assert sorted(t for t, *_ in indexes) == sorted(t.split(".")[-1] for t in tables), indexes
    for table, index, tail, valid in indexes:
        assert index == f"{table}_job_type_id_idx", indexes
        assert tail == PARTIAL and valid, indexes
    assert leftovers == (0,)


@pytest.mark.timeout(180)
def test_the_partial_index_replaces_the_old_one_without_holding_up_writes(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _upto(monkeypatch, empty_dsn, VERSION)
    _fill(empty_dsn)
    errors: list[BaseException] = []
    waits: list[float] = []
    done = threading.Event()

    def run_migrate() -> None:
        try:
            migrate.migrate(empty_dsn, "pgtick")
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def step(c: psycopg.Connection) -> None:
        """The application's enqueue and a daemon's claim of it, timed."""
        started = time.monotonic()
        with c.transaction():
            row = c.execute("SELECT enqueue('app')").fetchone()
            assert row is not None
            c.execute(
                "UPDATE runs SET status = 'running', locked_by = 'w',"
                " locked_until = now() + interval '1 minute' WHERE id = %s",
                [row[0]],
            )
        waits.append(time.monotonic() - started)

    def write() -> None:
        """Every 10 ms until the migration ends; a write refused (lock_timeout) is an error."""
        with dbhelp.connect(empty_dsn, "pgtick") as c:
            c.execute("SET lock_timeout = '5s'")
            while not done.is_set():
                try:
                    step(c)
                except psycopg.Error as exc:
                    errors.append(exc)
                    return
                time.sleep(0.01)

    with dbhelp.connect(empty_dsn, "pgtick") as operator:
        with operator.transaction():
            # An operator's psql: a run updated by hand, the transaction left open.
            operator.execute(
                "UPDATE runs SET priority = 5 WHERE job_type = 'live' AND id = "
                "(SELECT min(id) FROM runs WHERE job_type = 'live')"
            )
            migrator = threading.Thread(target=run_migrate)
            writer = threading.Thread(target=write)
            migrator.start()
            writer.start()
            time.sleep(4)  # the migration waits for the operator all along
            assert not done.is_set(), errors
        migrator.join(120)
    writer.join(10)
    assert not errors, errors
    assert len(waits) > 100
    assert max(waits) < 1.5, f"a write waited {max(waits):.2f}s behind the migration"
    _assert_partial_everywhere(empty_dsn)
    with dbhelp.connect(empty_dsn, "pgtick") as c:
        migrate.check_current(c, "pgtick")
        # A partition made after the migration has the index under the usual name.
        c.execute(
            "CREATE TABLE runs_succeeded_2999 PARTITION OF runs_succeeded"
            " FOR VALUES FROM ('2999-01-01') TO ('2999-01-02')"
        )
    _assert_partial_everywhere(empty_dsn)


def test_an_interrupted_migration_finishes_when_run_again(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _upto(monkeypatch, empty_dsn, VERSION)
    _fill(empty_dsn)
    (file,) = [m for m in files if m.version == VERSION]
    statements = file.statements()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("SET search_path TO pgtick")
        for statement in statements[:3]:  # the function, the parents' indexes, the leaves'
            migrate._run(c, statement, pooled=False)
        # A leaf built but not attached, one left invalid, and one dropped by retention.
        c.execute("DROP INDEX runs_live_job_type_id_pidx")
        c.execute(
            "CREATE TABLE runs_dead_2999 PARTITION OF runs_dead"
            " FOR VALUES FROM ('2999-01-01') TO ('2999-01-02')"
        )
        c.execute("ALTER TABLE runs_dead DETACH PARTITION runs_dead_2999")
        c.execute("DROP TABLE runs_dead_2999")
    migrate.migrate(empty_dsn, "pgtick")
    _assert_partial_everywhere(empty_dsn)


def test_generated_statements_on_a_dropped_partition_are_passed_over(empty_dsn: str) -> None:
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        statement = (
            "-- pgtick: gexec\n"
            "SELECT 'CREATE INDEX CONCURRENTLY gone_idx ON gone (a)'"
            " UNION ALL SELECT 'CREATE TABLE made (a int)';"
        )
        migrate._run(c, statement, pooled=False)
        assert c.execute("SELECT to_regclass('made') IS NOT NULL").fetchone() == (True,)
        with c.transaction():
            migrate._run(c, statement.replace("made", "made2"), pooled=True)
        assert c.execute("SELECT to_regclass('made2') IS NOT NULL").fetchone() == (True,)
