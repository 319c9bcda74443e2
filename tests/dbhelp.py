"""A direct connection for the tests' own SQL, which names pgtick's tables unqualified.

pgtick's statements qualify every table with the schema and its connections set no
``search_path`` (they must work behind a transaction-mode pooler); the tests' assertions and
fixtures are plain SQL on one direct connection, where a session ``search_path`` is fine.
"""

from __future__ import annotations

from psycopg import sql

from pgtick import db


def connect(dsn: str, schema: str) -> db.Connection:
    """``db.connect`` plus ``search_path`` on ``schema``, for SQL written in tests."""
    conn = db.connect(dsn, schema)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn
