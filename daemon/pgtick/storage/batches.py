"""Batches (docs/composition.md, Batches; migration 0026): open one with its callback, add
members (enqueue with ``batch_id``), close it; read one for ``pgtick batch`` and the console.

Every rule lives in the schema's functions (batch_open, batch_add, batch_members_added,
batch_close, and batch_ended/batch_reopened, which the statements recording outcomes call):
this module only calls them, from the application's connection or the store's pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgtick.storage import db, sqlfile
from pgtick.storage.base import StoreBase


@dataclass(frozen=True)
class Batch:
    """A batches row, and its members still kept by status (``kept``)."""

    id: int
    state: str  # open | closed | done
    callback: list[dict[str, Any]] | None
    members: int
    succeeded: int
    dead: int
    cancelled: int
    skipped: int
    callback_run_id: int | None
    created_at: datetime
    closed_at: datetime | None
    done_at: datetime | None
    kept: Mapping[str, int]

    @property
    def ended(self) -> int:
        return self.succeeded + self.dead + self.cancelled + self.skipped


def _callback(steps: Sequence[Mapping[str, Any]] | None) -> Jsonb | None:
    return None if not steps else Jsonb([dict(s) for s in steps])


def open_on(
    conn: psycopg.Connection[Any], schema: str, callback: Sequence[Mapping[str, Any]] | None
) -> int:
    """Open a batch on the caller's connection and transaction; returns its id."""
    with db.wrap_errors("batch_open"):
        row = conn.execute(
            sqlfile.query("batch_open", schema), {"callback": _callback(callback)}
        ).fetchone()
    assert row is not None
    return int(row[0])


def close_on(conn: psycopg.Connection[Any], schema: str, batch_id: int) -> str:
    """Close a batch; returns its state after: closed, or done (callback enqueued)."""
    with db.wrap_errors("batch_close"):
        row = conn.execute(sqlfile.query("batch_close", schema), {"batch_id": batch_id}).fetchone()
    assert row is not None
    return str(row[0])


class BatchQueries(StoreBase):
    """The batches aggregate, for the CLI and the console."""

    def open_batch(self, callback: Sequence[Mapping[str, Any]] | None) -> int:
        with self._conn("batch_open") as conn, conn.transaction():
            return open_on(conn, conn.schema, callback)

    def close_batch(self, batch_id: int) -> str:
        with self._conn("batch_close") as conn, conn.transaction():
            return close_on(conn, conn.schema, batch_id)

    def get_batch(self, batch_id: int) -> Batch | None:
        rows = self._all("get_batch", "get_batch", {"batch_id": batch_id})
        return Batch(*rows[0]) if rows else None
