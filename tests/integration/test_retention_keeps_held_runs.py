"""Retention never removes a run that is still held (issue 42, finding 4). A run an operator
cancelled keeps its holder until its handler stops, in the cancelled partition of the cancel's
period: dropping that partition (or deleting the row from a DEFAULT partition, or `pgtick
prune`) while the handler still ran freed the run's max_running slot beside it and lost its
row. The partition stays until the holder lets go; the others go as before."""

from __future__ import annotations

from psycopg.types.json import Jsonb

from pgtick.storage import db
from pgtick.storage.store import RunStore
from tests.integration import partitions

HOUR = 3600.0
RETENTION = Jsonb(dict.fromkeys(("succeeded", "dead", "cancelled", "skipped"), HOUR))


def _cancelled(conn: db.Connection, hours_ago: float, *, held: bool, key: str | None) -> int:
    row = conn.execute(
        "INSERT INTO runs (job_type, status, attempts, started_at, finished_at, locked_by,"
        " locked_until, idempotency_key)"
        " VALUES ('export', 'cancelled', 1, now() - (%(h)s + 1) * interval '1 hour',"
        "         date_trunc('hour', now()) - %(h)s * interval '1 hour',"
        "         CASE WHEN %(held)s THEN 'w-1' END,"
        "         CASE WHEN %(held)s THEN now() + interval '1 hour' END, %(key)s)"
        " RETURNING id",
        {"h": hours_ago, "held": held, "key": key},
    ).fetchone()
    assert row is not None
    if key is not None:
        conn.execute("INSERT INTO run_keys VALUES (%s, %s)", (key, row[0]))
    return int(row[0])


def _maintain(conn: db.Connection) -> list[tuple[str, str]]:
    """Retention passes until one does nothing: (action, table) of each."""
    done: list[tuple[str, str]] = []
    while True:
        rows = conn.execute(
            "SELECT action, table_name FROM maintain_partitions(%s)", (RETENTION,)
        ).fetchall()
        if not rows or rows[0][0] == "busy":
            return done
        done.append((rows[0][0], rows[0][1]))


def _exists(conn: db.Connection, run_id: int) -> bool:
    row = conn.execute("SELECT count(*) FROM runs WHERE id = %s", (run_id,)).fetchone()
    return row is not None and row[0] == 1


def _keys(conn: db.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT idempotency_key FROM run_keys")}


def test_a_partition_with_a_held_cancelled_run_stays_until_it_is_let_go_of(
    conn: db.Connection,
) -> None:
    held_part = partitions.past(conn, "runs_cancelled", (3, 2))
    free_part = partitions.past(conn, "runs_cancelled", (5, 4))
    held = _cancelled(conn, 2.5, held=True, key="held-key")
    beside = _cancelled(conn, 2.5, held=False, key="beside-key")
    free = _cancelled(conn, 4.5, held=False, key="free-key")
    # Older than every partition: the DEFAULT partition's rows.
    held_default = _cancelled(conn, 10, held=True, key=None)
    free_default = _cancelled(conn, 10, held=False, key=None)

    done = _maintain(conn)
    assert ("dropped", free_part) in done
    assert ("dropped", held_part) not in done
    assert _exists(conn, held) and _exists(conn, beside) and _exists(conn, held_default)
    assert not _exists(conn, free) and not _exists(conn, free_default)
    assert _keys(conn) == {"held-key", "beside-key"}  # the dropped run's key went with it

    # The holder lets go (its handler stopped): the next passes drop and delete the rest.
    conn.execute(
        "UPDATE runs SET locked_by = NULL, locked_until = NULL WHERE id IN (%s, %s)",
        (held, held_default),
    )
    done = _maintain(conn)
    assert ("dropped", held_part) in done
    assert not any(_exists(conn, i) for i in (held, beside, held_default))
    assert _keys(conn) == set()


def test_prune_keeps_a_held_cancelled_run(conn: db.Connection, store: RunStore) -> None:
    held = _cancelled(conn, 10, held=True, key="held-key")
    free = _cancelled(conn, 10, held=False, key="free-key")
    assert store.count_prunable("cancelled", HOUR) == 1
    assert store.prune("cancelled", HOUR) == 1
    assert _exists(conn, held) and not _exists(conn, free)
    assert _keys(conn) == {"held-key"}
