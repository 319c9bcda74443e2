"""`pgtick migrate` through PgBouncer in transaction mode: transactional migrations apply under
a transaction-level advisory lock (nothing left on the pooler's server connections); a
migration that builds indexes concurrently stops it with one line asking for a direct DSN;
once applied, `migrate` through the pooler says the schema is up to date, again and again."""

from __future__ import annotations

import concurrent.futures

import psycopg

from pgtick.storage import migrate
from tests.acceptance.cli import pgtick

NO_TRANSACTION = [m for m in migrate.available() if not m.transactional]


def advisory_locks(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    assert row is not None
    return int(row[0])


def applied_versions(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("SELECT version FROM pgtick.schema_migrations ORDER BY 1")]


def test_migrate_through_pgbouncer(empty_dsn: str, pooled_empty_dsn: str) -> None:
    assert NO_TRANSACTION, "the test needs a no-transaction migration to show the refusal"
    first = NO_TRANSACTION[0]
    before = [m.version for m in migrate.available() if m.version < first.version]
    # Two migrators at once through the pooler: the transactional migrations apply once.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: pgtick(pooled_empty_dsn, "migrate"), range(2)))
    for result in results:
        assert result.code == 2, result.text + result.error
        assert result.err == [
            f"pgtick: migrate: migration {first.version}_{first.name} builds indexes "
            "concurrently, outside a transaction, which needs a direct connection, and this DSN "
            "goes through a connection pooler: run `pgtick migrate --dsn` with a direct DSN once "
            "(the migrations before it are applied)"
        ]
    with psycopg.connect(empty_dsn, autocommit=True) as direct:
        assert applied_versions(direct) == before
        assert advisory_locks(direct) == 0  # no lock left behind on a server connection

        finished = pgtick(empty_dsn, "migrate")  # the direct DSN, once
        assert finished.code == 0, finished.error
        assert applied_versions(direct) == [m.version for m in migrate.available()]
        for _ in range(6):
            again = pgtick(pooled_empty_dsn, "migrate")
            assert (again.code, again.out) == (0, ["schema 'pgtick' is up to date"]), again.error
        assert advisory_locks(direct) == 0
