"""The composition root: builds the pools, wires the loops, owns signals and shutdown.

Only this package knows all the parts. ``Service`` is ``pgtick run``: it checks the config and
the database, then runs the daemon in one of two shapes (docs/architecture.md, "The process
model"):

- ``worker.processes = 1``: one process, as before issue 47 (``Service._serve``): the worker
  half (``work.WorkSide``), the once-per-daemon loops (``once.OnceSide``), the LISTEN
  connection and the HTTP listeners (``endpoints``), all on threads;
- above 1: a supervisor process (``supervisor``) owns what exists once per daemon and runs
  the worker processes (``children``), each a ``WorkSide`` of its own (``child``).

Side loops and handler threads run on threads; if one dies the process stops loudly (exit 1)
rather than limping on, and systemd restarts it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

import structlog

import pgtick
from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.lifecycle import Held
from pgtick.core.listener import Listener
from pgtick.core.worker import claim_type
from pgtick.observability import logs, tracing
from pgtick.observability.metrics import Metrics
from pgtick.observability.outage import tell_pool_warnings
from pgtick.observability.systemd import Notifier
from pgtick.service.drain import EXIT_HOLD_SECONDS
from pgtick.service.endpoints import Endpoints
from pgtick.service.loops import (
    LoopThread,
    dead_threads,
    log_summary,
    stale_loops,
    warn_if_no_job_types,
    watch,
    worker_id,
)
from pgtick.service.once import OnceSide
from pgtick.service.work import WorkSide, beat_pool
from pgtick.storage import db, migrate
from pgtick.storage.store import RunStore
from pgtick.surfaces.operations.setup import database_checks, pool_size, startup_checks

__all__ = ["EXIT_HOLD_SECONDS", "Service", "worker_id"]

PREPARED_STATEMENTS_OFF = (
    "prepared statements off: database.dsn goes through a connection pooler, where a statement"
    " prepared on one server connection is missing on the next; database.prepared_statements ="
    " true applies to direct connections only (set it to false to say so)"
)

log = structlog.get_logger("pgtick.service")


class Service:
    """``pgtick run``: everything one daemon does, from start-up to a clean stop."""

    def __init__(
        self,
        config: Config,
        dsn: str,
        *,
        apply_migrations: bool = False,
        notifier: Notifier | None = None,
        log_each_run: bool = False,
    ) -> None:
        self.config = config
        self.dsn = dsn
        logs.protect_dsn(dsn)  # psycopg's messages may quote it; no log line may show it
        self.apply_migrations = apply_migrations
        self.log_each_run = log_each_run
        self.notifier = notifier or Notifier()
        self._stop = threading.Event()
        self._force = threading.Event()
        self._signals = 0
        self.worker_id = worker_id()
        self._endpoints = Endpoints(config, dsn)
        self._once: OnceSide | None = None
        self._dead: list[str] = []  # threads found dead by the supervising loop
        self._tracing = tracing.Tracing()  # off until _serve starts it

    # -- signals --------------------------------------------------------------------------------

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        """First signal: warm stop (drain). Second: cold stop (skip the grace period)."""
        self._signals += 1
        if self._signals == 1:
            self._stop.set()
        else:
            self._force.set()

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self.request_stop)
        return previous

    # -- running ----------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; returns the process exit code."""
        cfg = self.config
        job_types = startup_checks(cfg)  # before migrating: a config refused changes nothing
        schema = cfg.database.schema
        if self.apply_migrations:
            applied = migrate.migrate(self.dsn, schema)
            if applied:
                log.info("migrations_applied", versions=applied)
        with db.connect(self.dsn, schema) as conn:
            database_checks(cfg, conn)
            prepare = self._prepare_statements(conn)
        if cfg.worker.process_count > 1:
            from pgtick.service.supervisor import Supervisor

            supervisor = Supervisor(
                cfg,
                self.dsn,
                job_types,
                notifier=self.notifier,
                prepare=prepare,
                log_each_run=self.log_each_run,
            )
            previous_signals = self._install_signals()
            try:
                return supervisor.run(self._stop, self._force)
            finally:
                _restore_signals(previous_signals)
                self.notifier.close()
        pool = db.make_pool(self.dsn, schema, size=pool_size(cfg), name="pgtick", prepare=prepare)
        beats = beat_pool(self.dsn, cfg)
        previous_signals = self._install_signals()
        try:
            return self._serve(RunStore(pool), RunStore(beats), job_types)
        finally:
            _restore_signals(previous_signals)
            self._endpoints.stop()
            self._tracing.shutdown()  # the spans of the last attempts, sent
            beats.close(timeout=2.0)
            pool.close(timeout=2.0)
            self.notifier.close()

    def _prepare_statements(self, conn: db.Connection) -> bool:
        """Whether the worker pool prepares its statements on the server: as
        ``database.prepared_statements`` says, but never through a connection pooler (told
        as the listener tells it, by the backend pid), where a statement prepared on one
        server connection is missing on the next (PgBouncer in transaction mode). ``true``,
        the default that config.example.toml also writes, cannot show that the operator
        knew of the pooler, so it is overridden there; the price is speed, not results."""
        db_cfg = self.config.database
        if not db_cfg.prepared_statements:
            return False
        with db.wrap_errors("pooler check"):
            pooled = db.behind_pooler(conn, db_cfg.schema)
        if pooled:
            log.info("prepared_statements_off", message=PREPARED_STATEMENTS_OFF)
        return not pooled

    def _serve(
        self, store: RunStore, beat_store: RunStore, job_types: dict[str, handlers.JobType]
    ) -> int:
        """``worker.processes = 1``: every part in this one process."""
        cfg = self.config
        metrics = Metrics(job_types, pgtick.__version__, cfg.worker.threads)
        tell_pool_warnings(metrics.outage)  # one outage, told once (outage.py)
        limits = [
            t for jt in job_types.values() if (t := claim_type(jt.config, jt.lease_seconds)).limited
        ]
        self._endpoints.start_http(
            {"pgtick": store.pool.get_stats}, metrics, limits, self._last_tick_at, self._problem
        )
        self._endpoints.start_web(limits)
        # After startup_checks imported the handler modules: one that set a tracer provider
        # of its own keeps it (otel.py).
        self._tracing = tracing.start(cfg.tracing.enabled, pgtick.__version__)
        if self._tracing.enabled:
            log.info("tracing_enabled")
        work = WorkSide(
            cfg,
            store,
            beat_store,
            self.worker_id,
            job_types,
            metrics,
            log_each_run=self.log_each_run,
            tracing=self._tracing,
        )
        worker = work.worker
        listener = Listener(
            self.dsn,
            cfg.database.schema,
            set(worker.handled),
            worker.notified,
            metrics,
            listen_dsn=cfg.database.listen_dsn,
            on_rescan=worker.rescan,
            on_due=worker.due,
            on_controls=worker.controls_changed,
        )
        worker.bounds.notifying = lambda: listener.connected
        worker.controls.notifying = lambda: listener.connected
        once = self._once = OnceSide(cfg, store, job_types, metrics)
        once.prepare()
        loops = [work.start_heartbeat(), LoopThread("listener", listener.run), *once.loops()]
        for loop in loops[1:]:
            loop.thread.start()
        worker_threads = work.start_threads()
        log.info(
            "daemon_started",
            worker_id=self.worker_id,
            threads=cfg.worker.threads,
            processes=1,
            job_types=handlers.handler_summary(job_types),
        )
        warn_if_no_job_types(cfg, job_types)
        self.notifier.ready(work.status())
        crashed = self._supervise(work, worker_threads, loops, once)
        at_exit: list[Held] = []
        once.ticker.stop_event.set()
        crashed = not work.drain(self._force, self.notifier, at_exit) or crashed
        listener.stop_event.set()
        once.stop()
        work.finish(at_exit)
        for loop in loops:
            loop.thread.join(timeout=2.0)
        code = 1 if crashed else 0
        log.info("daemon_stopped", worker_id=self.worker_id, exit_code=code)
        if at_exit:
            work.exit_releasing(at_exit, code)
        return code

    def _problem(self) -> str | None:
        """Why this daemon is not ready beyond the database and the ticker: a dead thread."""
        if self._dead:
            return f"threads died: {', '.join(self._dead)} (stopping)"
        return None

    def _last_tick_at(self) -> float | None:
        return None if self._once is None else self._once.last_tick_at()

    def _supervise(
        self,
        work: WorkSide,
        worker_threads: list[threading.Thread],
        loops: list[LoopThread],
        once: OnceSide,
    ) -> bool:
        """Watch the loops until asked to stop; True if one of them died."""
        return watch(
            self._stop,
            self.notifier,
            lambda: dead_threads(loops, worker_threads),
            lambda: stale_loops(
                {
                    **work.stale_limits(),
                    "ticker": (once.ticker.alive_at, self.config.ticker.interval_seconds),
                }
            ),
            work.status,
            lambda: log_summary(work.worker.life),
            self._dead,
        )


def _restore_signals(previous: dict[int, Any]) -> None:
    """After the stop: the handlers there were before, but a default action becomes
    ignore: the process is ending, and a second SIGTERM in its last moments (a pool
    closing, multiprocessing's exit) killed it, turning a clean exit 0 into -15 (torture
    seed 4318, d1#16)."""
    for signum, handler in previous.items():
        signal.signal(signum, signal.SIG_IGN if handler == signal.SIG_DFL else handler)
