"""The console's pictures read here rather than through the store: queue depth per job type over
the last hour, rebuilt from runs and attempts by one bounded query of ``charts.sql``.

The statements live in ``charts.sql`` beside this module, in the same ``-- name --`` block
format as ``storage/sql/queries.sql`` (parsed by ``sqlfile.parse_blocks``), and run on the
store's connection: inside ``RunStore.reading`` that is the page's read-only, time-bounded
transaction, and a savepoint keeps a timeout here from spoiling the rest of the page.
"""

from __future__ import annotations

import functools
import importlib.resources

from psycopg import sql

from pgtick.storage.sqlfile import parse_blocks
from pgtick.storage.store import RunStore

SQL_FILE = "charts.sql"


@functools.cache
def _blocks() -> dict[str, str]:
    text = importlib.resources.files(__package__ or "").joinpath(SQL_FILE).read_text("utf-8")
    return parse_blocks(text)


@functools.cache
def _query(name: str, schema: str) -> sql.SQL:
    """A statement of ``charts.sql`` for ``schema`` (``{schema}`` as a quoted identifier, so
    nothing depends on a connection's ``search_path``)."""
    rendered = sql.SQL(_blocks()[name]).format(schema=sql.Identifier(schema))
    return sql.SQL(rendered.as_string(None))


def queue_depth_per_type(store: RunStore, minutes: int) -> dict[str, list[int]]:
    """Per job type, the runs due and waiting to start at each of the last ``minutes``
    minutes, oldest first (the last value is now, the one before it a minute ago).

    An approximation from the rows (``charts.sql`` says exactly what it counts): a retry
    waits only from its ``run_at``, never during its backoff; an earlier wait whose due time
    a later retry overwrote is left out, except a scheduled run's first (from its occurrence)
    and a wait after a released attempt. Job types with no run waiting in the window are
    absent. Raises ``DatabaseError`` (a ``PgtickError``) when the read fails or times out.
    """
    with store.connection("console") as conn, conn.transaction():
        rows = conn.execute(
            _query("queue_depth_per_type_minute", conn.schema), {"minutes": minutes}
        )
        changes: dict[str, dict[int, int]] = {}
        for job_type, minutes_ago, depth in rows.fetchall():
            changes.setdefault(str(job_type), {})[int(minutes_ago)] = int(depth)
    per_type: dict[str, list[int]] = {}
    for job_type, at in changes.items():
        counts, depth = [], 0
        for minutes_ago in range(minutes - 1, -1, -1):
            depth = at.get(minutes_ago, depth)
            counts.append(depth)
        per_type[job_type] = counts
    return per_type
