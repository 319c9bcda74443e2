"""The operator's setup verbs: the one-connection store a command works on, migrations, grants,
and the checks of ``pgtick check`` (handlers importable, schema current).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TextIO

from pgtick.config import Config
from pgtick.core import handlers
from pgtick.storage import db
from pgtick.storage import migrate as migrations
from pgtick.storage.store import RunStore

CLI_POOL_NAME = "pgtick-cli"


@contextlib.contextmanager
def open_store(dsn: str, schema: str) -> Iterator[RunStore]:
    """A one-connection store for one command, closed however the command ends."""
    store = RunStore(db.make_pool(dsn, schema, size=1, name=CLI_POOL_NAME))
    try:
        yield store
    finally:
        store.pool.close()


def migrate(
    dsn: str, schema: str, *, force: bool = False, progress_stream: TextIO | None = None
) -> list[str]:
    """Apply pending migrations (as the schema owner); the names of those applied. ``force``
    applies one that needs every daemon stopped while some still heartbeat; a long copy shows
    its progress on ``progress_stream`` if it is a terminal."""
    return migrations.migrate(dsn, schema, force=force, progress_stream=progress_stream)


def grants_sql(role: str, schema: str, *, monitor: bool = False) -> str:
    """The GRANT statements ``role`` needs to run the daemon and the operator verbs (and,
    with ``monitor``, to see every role's sessions holding the MVCC horizon)."""
    return migrations.grants_sql(role, schema, monitor=monitor)


def check_database(dsn: str, schema: str) -> None:
    """Refuse an unreachable database or a schema older than this pgtick."""
    with db.connect(dsn, schema) as conn, db.wrap_errors("check"):
        migrations.check_current(conn, schema)


def handler_summary(config: Config) -> dict[str, str]:
    """{job type: what handles it} for every job type the config declares, its
    ``worker.imports`` imported (a handler that cannot be imported is a ConfigError)."""
    return handlers.handler_summary(handlers.resolve(config))
