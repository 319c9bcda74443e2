"""Test session: one PostgreSQL (embedded, or $PGTICK_TEST_DSN), a migrated template database,
and a fresh database per test created from it (no rollback-per-test: workers commit)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgtick.embedded import EmbeddedPostgres
from pgtick.storage import db, migrate
from pgtick.storage.store import RunStore

# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment, and the CLI cuts
# long values to COLUMNS when it is set (cli/render.py): the tests' piped commands would be cut
# under `make test` (two workers) and whole when run alone. A test that wants a width sets it.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

SCHEMA = "pgtick"


def _admin_execute(admin_dsn: str, statement: sql.Composable) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(statement)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """DSN of a superuser on the test server's maintenance database."""
    given = os.environ.get("PGTICK_TEST_DSN")
    if given:
        yield given
        return
    # Not under pytest's basetemp: each pytest session run as root resets it to mode 0700,
    # which locks out the unprivileged user the embedded server runs as.
    data_dir = Path(tempfile.mkdtemp(prefix="pgtick-test-pg-"))
    server = EmbeddedPostgres(data_dir, throwaway=True)
    try:
        yield server.dsn
    finally:
        server.close()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg_admin_dsn: str) -> Iterator[str]:
    """A database migrated once; each test copies it."""
    name = f"pgtick_tpl_{os.getpid()}"
    _admin_execute(
        pg_admin_dsn,
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
    )
    _admin_execute(pg_admin_dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate.migrate(make_conninfo(pg_admin_dsn, dbname=name), SCHEMA)
    yield name
    _admin_execute(
        pg_admin_dsn,
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
    )


def new_database(admin_dsn: str, template: str | None) -> str:
    name = f"t_{uuid.uuid4().hex[:16]}"
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    _admin_execute(admin_dsn, statement)
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    _admin_execute(
        admin_dsn, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )


@pytest.fixture
def dsn(pg_admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    name = new_database(pg_admin_dsn, template_db)
    try:
        yield make_conninfo(pg_admin_dsn, dbname=name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def empty_dsn(pg_admin_dsn: str) -> Iterator[str]:
    """A fresh database with no pgtick schema (migration tests)."""
    name = new_database(pg_admin_dsn, None)
    try:
        yield make_conninfo(pg_admin_dsn, dbname=name)
    finally:
        drop_database(pg_admin_dsn, name)


@pytest.fixture
def conn(dsn: str) -> Iterator[db.Connection]:
    """An autocommit connection with search_path on the pgtick schema, for assertions."""
    with db.connect(dsn, SCHEMA) as connection:
        # pgtick's own statements name their schema; the tests' SQL relies on search_path.
        connection.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(SCHEMA)))
        yield connection


@pytest.fixture
def store(dsn: str) -> Iterator[RunStore]:
    pool = db.make_pool(dsn, SCHEMA, size=4, name="pgtick-test")
    try:
        yield RunStore(pool)
    finally:
        pool.close()


@pytest.fixture
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
