"""The LISTEN side of the NOTIFY that enqueue, retry, the reaper and materialization send: a
dedicated connection, outside the pool, that wakes idle dispatchers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pgtick.storage import db, sqlfile


class Notifications:
    """A dedicated LISTEN connection (outside the pool): the job types named by NOTIFYs.
    ``pooled``: the connection goes through a pooler, and nothing was LISTENed on it."""

    def __init__(self, conn: db.Connection, *, pooled: bool = False) -> None:
        self._conn = conn
        self.pooled = pooled

    def next(self, timeout: float) -> list[str]:
        """The payload of the next NOTIFY, waiting up to ``timeout`` seconds ([] if none)."""
        with db.wrap_errors("listen"):
            return [n.payload for n in self._conn.notifies(timeout=timeout, stop_after=1)]


@contextlib.contextmanager
def listening(dsn: str, schema: str, *, detect_pooler: bool = False) -> Iterator[Notifications]:
    """Open a LISTEN connection on the schema's channel; errors are DatabaseError. With
    ``detect_pooler``, a connection through a pooler LISTENs to nothing (a LISTEN would stay
    behind on one of its server connections and hear nothing): ``pooled`` says so."""
    with db.wrap_errors("listen"):
        conn = db.connect_raw(dsn, application_name="pgtick-listener")
    try:
        with db.wrap_errors("listen"):
            if detect_pooler and db.behind_pooler(conn, schema):
                yield Notifications(conn, pooled=True)
                return
            conn.execute(sqlfile.with_schema("listen", schema))
        yield Notifications(conn)
    finally:
        with contextlib.suppress(Exception):  # the connection may be broken already
            conn.close()
