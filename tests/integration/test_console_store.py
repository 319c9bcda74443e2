"""The console's reads: one read-only, time-bounded transaction, and the per-minute chart."""

from __future__ import annotations

import pytest

from pgtick.errors import DatabaseError
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations


def test_reading_is_read_only_and_bounded(store: RunStore, conn: db.Connection) -> None:
    conn.execute("INSERT INTO runs (job_type, status) VALUES ('t', 'dead')")
    with (
        pytest.raises(DatabaseError, match="ReadOnlySqlTransaction"),
        store.reading("console", statement_timeout_seconds=2, pool_timeout_seconds=2) as reader,
    ):
        reader.retry([1])
    assert conn.execute("SELECT status FROM runs").fetchall() == [("dead",)]
    with (
        pytest.raises(DatabaseError, match="QueryCanceled"),
        store.reading("console", statement_timeout_seconds=0.05, pool_timeout_seconds=2) as reader,
        reader.connection() as pinned,
        db.wrap_errors("sleep"),
    ):
        pinned.execute("SELECT pg_sleep(1)")


def test_reading_compiles_nothing(store: RunStore, conn: db.Connection) -> None:
    """A console read turns JIT off for its transaction only: on PostgreSQL 15 with LLVM the
    overview's queue depth spent 3 s compiling at 1 M runs (bench console --server 15)."""
    with (
        store.reading("console", statement_timeout_seconds=2, pool_timeout_seconds=2) as reader,
        reader.connection() as pinned,
    ):
        assert pinned.execute("SELECT current_setting('jit')").fetchone() == ("off",)
    with store.connection("after") as plain:
        assert plain.execute("SELECT current_setting('jit')").fetchone() == ("on",)


def test_succeeded_per_minute_oldest_first(store: RunStore, conn: db.Connection) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at) VALUES"
        " ('t', 'succeeded', now() - interval '10 seconds'),"
        " ('t', 'succeeded', now() - interval '20 seconds'),"
        " ('t', 'succeeded', now() - interval '150 seconds'),"
        " ('t', 'succeeded', now() - interval '2 hours'),"
        " ('t', 'dead', now() - interval '10 seconds')"
    )
    counts = store.succeeded_per_minute(60)
    assert len(counts) == 60 and counts[-1] == 2 and counts[-3] == 1 and sum(counts) == 3
    with store.reading("console", statement_timeout_seconds=2, pool_timeout_seconds=2) as reader:
        ov = operations.overview(reader, heartbeat_seconds=20)
    assert ov.succeeded_per_minute == counts
    assert [t.stats.job_type for t in ov.job_types] == ["t"]  # the recent dead one


def test_finished_per_type_minute_counts_succeeded_and_dead_by_type(
    store: RunStore, conn: db.Connection
) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, finished_at) VALUES"
        " ('mail', 'succeeded', now() - interval '10 seconds'),"
        " ('mail', 'succeeded', now() - interval '20 seconds'),"
        " ('mail', 'dead', now() - interval '30 seconds'),"
        " ('mail', 'dead', now() - interval '150 seconds'),"
        " ('sync', 'succeeded', now() - interval '59 minutes'),"
        " ('sync', 'succeeded', now() - interval '2 hours'),"
        " ('sync', 'cancelled', now() - interval '10 seconds')"
    )
    conn.execute(
        "INSERT INTO runs (job_type, status) VALUES ('mail', 'failed'), ('idle', 'queued')"
    )
    per_type = store.finished_per_type_minute(60)
    assert set(per_type) == {"mail", "sync"}
    mail_ok, mail_dead = per_type["mail"]
    assert len(mail_ok) == len(mail_dead) == 60
    assert (mail_ok[-1], sum(mail_ok), mail_dead[-1], mail_dead[-3], sum(mail_dead)) == (
        2,
        2,
        1,
        1,
        2,
    )
    sync_ok, sync_dead = per_type["sync"]
    assert (sync_ok[0], sum(sync_ok), sum(sync_dead)) == (1, 1, 0)
    with store.reading("console", statement_timeout_seconds=2, pool_timeout_seconds=2) as reader:
        ov = operations.overview(reader, heartbeat_seconds=20)
    assert ov.finished_per_type == per_type
