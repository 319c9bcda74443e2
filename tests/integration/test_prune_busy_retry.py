"""`pgtick prune` waits out a lock held elsewhere on a partition it drops, without queueing in
front of anyone (issue 44, item 2): a step finding a lock taken is "busy" at once (migration
0020, NOWAIT), and the prune tries it again after a growing pause rather than leave the
partition for the rows' deletion; before, it waited 50 ms, gave up and left it."""

from __future__ import annotations

import threading

from psycopg import sql

from pgtick.storage import db
from pgtick.storage.store import RunStore
from tests import dbhelp
from tests.integration import partitions

HELD_SECONDS = 0.5
THIRTY_DAYS = 30 * 86400.0


def test_prune_drops_a_partition_a_reader_held_for_a_moment(
    dsn: str, store: RunStore, conn: db.Connection
) -> None:
    old = partitions.past(conn, "runs_dead", (24 * 40, 24 * 39))
    read = threading.Event()

    def reader() -> None:
        """A query of the old partition (pg_dump, a report) for half a second."""
        with dbhelp.connect(dsn, "pgtick") as other, other.transaction():
            other.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(old)))
            read.set()
            threading.Event().wait(HELD_SECONDS)

    thread = threading.Thread(target=reader)
    thread.start()
    read.wait(10)
    try:
        changes = store.prune_partitions(
            dict.fromkeys(("succeeded", "dead", "cancelled", "skipped"), THIRTY_DAYS)
        )
    finally:
        thread.join()
    assert ("dropped", old) in [(c.action, c.table) for c in changes], changes
    assert "busy" not in {c.action for c in changes}, changes
