"""A real PgBouncer in transaction pooling mode in front of the test session's PostgreSQL."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from bench.pgbouncer import PgBouncer
from psycopg.conninfo import conninfo_to_dict


@pytest.fixture(scope="session")
def bouncer(pg_admin_dsn: str) -> Iterator[PgBouncer]:
    """One pooler for the session (transaction mode, like most production poolers)."""
    workdir = Path(tempfile.mkdtemp(prefix="pgtick-test-pgbouncer-"))
    pooler = PgBouncer(pg_admin_dsn, workdir)
    try:
        yield pooler
    finally:
        pooler.close()


@pytest.fixture
def pooled_dsn(bouncer: PgBouncer, dsn: str) -> str:
    """This test's fresh database, reached through the pooler."""
    return bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))


@pytest.fixture
def pooled_empty_dsn(bouncer: PgBouncer, empty_dsn: str) -> str:
    """A fresh database with no schema yet, reached through the pooler."""
    return bouncer.dsn(str(conninfo_to_dict(empty_dsn)["dbname"]))
