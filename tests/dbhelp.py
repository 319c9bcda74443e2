"""What tests on the public surface need of the database, with psycopg and pgtick's SQL only
(no pgtick internals): a connection on the pgtick schema, and runs enqueued through the
documented ``pgtick.enqueue`` / ``<schema>.enqueue()`` and read back from the ``runs`` and
``attempts`` tables (their columns are public)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import namedtuple_row
from psycopg.types.json import Jsonb

import pgtick

SCHEMA = "pgtick"
# The run states, in the order the CLI and the metrics list them.
STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled", "skipped")

Connection = psycopg.Connection[Any]


def connect(dsn: str, schema: str = SCHEMA) -> Connection:
    """An autocommit connection with the pgtick schema on its search_path."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    return conn


def migrate(dsn: str) -> None:
    """`pgtick migrate`, as an operator runs it (the default schema, no config file)."""
    subprocess.run(
        [sys.executable, "-m", "pgtick", "migrate"],
        check=True,
        capture_output=True,
        env={**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""},
    )


@dataclass(frozen=True)
class NewRun:
    """A run to enqueue: the arguments of ``pgtick.enqueue``."""

    job_type: str
    payload: Mapping[str, Any] | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None


class Runs:
    """Enqueue and read runs of one database (each call on a connection of its own)."""

    def __init__(self, dsn: str, schema: str = SCHEMA) -> None:
        self.dsn = dsn
        self.schema = schema

    def enqueue(self, run: NewRun) -> int:
        with connect(self.dsn, self.schema) as conn:
            return pgtick.enqueue(
                conn,
                run.job_type,
                dict(run.payload) if run.payload is not None else None,
                run_at=run.run_at,
                idempotency_key=run.idempotency_key,
                max_attempts=run.max_attempts,
                schema=self.schema,
            )

    def enqueue_many(self, runs: Sequence[NewRun]) -> list[int]:
        """Many runs in one statement of ``enqueue()`` calls; ids in input order."""
        statement = sql.SQL(
            "SELECT {}.enqueue(j, coalesce(p, '{{}}'::jsonb), r, k, m) FROM unnest("
            "%s::text[], %s::jsonb[], %s::timestamptz[], %s::text[], %s::int[]) "
            "WITH ORDINALITY AS t(j, p, r, k, m, ord) ORDER BY ord"
        ).format(sql.Identifier(self.schema))
        params = (
            [r.job_type for r in runs],
            [None if r.payload is None else Jsonb(dict(r.payload)) for r in runs],
            [r.run_at for r in runs],
            [r.idempotency_key for r in runs],
            [r.max_attempts for r in runs],
        )
        with connect(self.dsn, self.schema) as conn:
            return [int(row[0]) for row in conn.execute(statement, params).fetchall()]

    def get_run(self, run_id: int) -> Any:
        """The ``runs`` row (attributes named as its columns), or None."""
        with connect(self.dsn, self.schema) as conn, conn.cursor(row_factory=namedtuple_row) as c:
            return c.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()

    def get_attempts(self, run_id: int) -> list[Any]:
        """The run's ``attempts`` rows, first attempt first."""
        with connect(self.dsn, self.schema) as conn, conn.cursor(row_factory=namedtuple_row) as c:
            query = "SELECT * FROM attempts WHERE run_id = %s ORDER BY attempt"
            return c.execute(query, (run_id,)).fetchall()

    def prune(self, status: str, older_than: str) -> int:
        """`pgtick prune --status STATUS --older-than AGE`; how many runs it deleted."""
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pgtick",
                "prune",
                "--status",
                status,
                "--older-than",
                older_than,
            ],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "PGTICK_DSN": self.dsn, "PGTICK_CONFIG": ""},
        )
        last = proc.stdout.splitlines()[-1]  # "total      deleted N"
        return int(last.rsplit(" ", 1)[1])

    def now(self) -> datetime:
        """The database clock."""
        with connect(self.dsn, self.schema) as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        value: datetime = row[0]
        return value
