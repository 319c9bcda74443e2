"""The operator's setup verbs: the one-connection store a command works on, migrations, grants,
and the start-up checks: what ``pgtick run`` refuses before it opens a pool, which ``pgtick
check`` runs as they are (one implementation: a config ``check`` passes starts).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TextIO

from pgtick.config import Config, read_token, read_viewer_token
from pgtick.core import handlers
from pgtick.core.dbstate import METRICS_POOL_SIZE
from pgtick.errors import ConfigError
from pgtick.observability import tracing
from pgtick.storage import db
from pgtick.storage import migrate as migrations
from pgtick.storage.store import RunStore

CLI_POOL_NAME = "pgtick-cli"
# The connections a daemon opens besides its worker pool (service.py opens them).
EXTRA_CONNECTIONS = 5
HEARTBEAT_POOL_SIZE = 1
LISTEN_CONNECTIONS = 1  # the LISTEN connection, outside every pool
WEB_POOL_SIZE = 2  # the console's reads and actions, apart from the workers' pool
# With worker.processes above 1, the supervisor's own pool: the ticker, the reaper, the
# recovery of a worker process that died, registering; the workers have pools of their own.
SUPERVISOR_POOL_SIZE = 3
CONSOLE_EXTRA_MISSING = (
    "{key}: the web console needs the console extra (waitress, jinja2): "
    "pip install 'pgtick[console]'"
)


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


def pool_size(cfg: Config) -> int:
    """The worker pool's connections: ``database.pool_size``, at least the threads and a few."""
    return max(cfg.database.pool_size, cfg.worker.threads + EXTRA_CONNECTIONS)


def require_console_extra(key: str) -> None:
    """Refuse, naming ``key``, a console whose extra is not installed."""
    try:
        import jinja2  # noqa: F401
        import waitress  # noqa: F401
    except ImportError:
        raise ConfigError(CONSOLE_EXTRA_MISSING.format(key=key)) from None


def startup_checks(cfg: Config) -> dict[str, handlers.JobType]:
    """Everything in the config ``pgtick run`` refuses at start, each a ConfigError (exit 2)
    naming the key: every handler imported; the console's extra and token file, when
    ``web.listen`` is set; the otel extra and the exporter's settings, when tracing is on
    (``tracing.enabled``, unless ``OTEL_SDK_DISABLED=true``). Not checked: whether a listen
    address is free (``pgtick check`` next to the running daemon would find its own ports
    taken)."""
    job_types = handlers.resolve(cfg)
    if cfg.web.enabled:
        require_console_extra("web.listen")
        read_token(cfg.web)
        read_viewer_token(cfg.web)
    if tracing.wanted(cfg.tracing.enabled):
        tracing.require_extra("tracing.enabled")
    return job_types


def database_checks(cfg: Config, conn: db.Connection) -> None:
    """What ``pgtick run`` refuses of the database before it opens a pool: more connections
    than the server accepts, a schema not current (older, or newer by a stop-daemons
    migration this pgtick does not know)."""
    _check_connection_limit(cfg, conn, pool_size(cfg))
    with db.wrap_errors("schema check"):
        migrations.check_current(conn, cfg.database.schema)


def check_database(dsn: str, cfg: Config) -> None:
    """``database_checks`` on a connection of its own (``pgtick check --db``)."""
    with db.connect(dsn, cfg.database.schema) as conn:
        database_checks(cfg, conn)


def connections_needed(cfg: Config) -> int:
    """Every connection one daemon may open: per worker process its pool and its heartbeat's;
    once per daemon the LISTEN connection, the metrics' and the console's pools, and above one
    process the supervisor's own pool (docs/architecture.md, "The process model")."""
    processes = cfg.worker.process_count
    needed = processes * (pool_size(cfg) + HEARTBEAT_POOL_SIZE) + LISTEN_CONNECTIONS
    needed += SUPERVISOR_POOL_SIZE if processes > 1 else 0
    needed += METRICS_POOL_SIZE if cfg.metrics.enabled else 0
    needed += WEB_POOL_SIZE if cfg.web.enabled else 0
    return needed


def _check_connection_limit(cfg: Config, conn: db.Connection, size: int) -> None:
    """Refuse more connections than the server accepts at all: a pool that can never fill
    fails only after its timeout, and floods the log with the server's refusals meanwhile."""
    needed = connections_needed(cfg)
    allowed, max_connections = RunStore.connection_limit_on(conn)
    if needed > allowed:
        where = f"{cfg.path}: " if cfg.path else ""
        one = dataclasses.replace(cfg, worker=dataclasses.replace(cfg.worker, processes=1))
        # The key to change: the processes when one alone would fit (the default's one per CPU
        # on a big VM), else the pool.
        key = "worker.processes" if connections_needed(one) <= allowed else "database.pool_size"
        raise ConfigError(
            f"{where}{key}: this daemon needs {needed} connections "
            f"({cfg.worker.process_count} worker process(es) with a pool of {size} each, and "
            f"the loops') but the server accepts at most {allowed} (max_connections = "
            f"{max_connections}, less reserved slots); lower database.pool_size, "
            "worker.threads or worker.processes, or raise max_connections"
        )


def handler_summary(config: Config) -> dict[str, str]:
    """{job type: what handles it} for every job type the config declares, after the
    ``startup_checks`` (a handler that cannot be imported is a ConfigError, and so is what
    else ``pgtick run`` would refuse at start)."""
    return handlers.handler_summary(startup_checks(config))
