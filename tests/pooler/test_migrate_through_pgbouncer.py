"""`pgtick migrate` through PgBouncer in transaction mode: transactional migrations apply under
a transaction-level advisory lock (nothing left on the pooler's server connections); a
migration that builds indexes concurrently builds them without CONCURRENTLY there; once
applied, `migrate` through the pooler says the schema is up to date, again and again."""

from __future__ import annotations

import concurrent.futures
import re

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
    """Two migrators at once through the pooler take a fresh database to the head: every
    transactional file once, the concurrent index builds without CONCURRENTLY (logged), and
    no lock is left behind on the pooler's server connections."""
    assert NO_TRANSACTION, "the test needs a no-transaction migration"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: pgtick(pooled_empty_dsn, "migrate"), range(2)))
    for result in results:
        assert result.code == 0, result.text + "\n".join(result.err)
    with psycopg.connect(empty_dsn, autocommit=True) as direct:
        assert applied_versions(direct) == [m.version for m in migrate.available()]
        assert advisory_locks(direct) == 0  # no lock left behind on a server connection
        for m in NO_TRANSACTION:  # the indexes the concurrent files build exist, and are valid
            renamed = dict(re.findall(r"ALTER INDEX (\w+) RENAME TO (\w+)", m.sql))
            for built in re.findall(r"CREATE INDEX CONCURRENTLY (\w+)", m.sql):
                name = renamed.get(built, built)  # 0008 builds beside the old, then renames
                row = direct.execute(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace"
                    " WHERE n.nspname = 'pgtick' AND c.relname = %s",
                    (name,),
                ).fetchone()
                assert row == (True,), (m.name, name)
        again = pgtick(empty_dsn, "migrate")  # a direct migrate finds nothing to do
        assert (again.code, again.out) == (0, ["schema 'pgtick' is up to date"]), again.error
        for _ in range(4):
            again = pgtick(pooled_empty_dsn, "migrate")
            assert (again.code, again.out) == (0, ["schema 'pgtick' is up to date"]), again.error
        assert advisory_locks(direct) == 0
