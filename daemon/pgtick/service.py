"""The composition root: builds the pool, wires the loops, owns signals and shutdown.

Only this module knows all the parts. Side loops (dispatcher, completer, heartbeat, listener,
reaper, ticker) run on threads; if one dies the service stops loudly (exit 1) rather than
limping on, and systemd restarts it.
"""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Protocol

import structlog

import pgtick
from pgtick import db, handlers, logs, migrate
from pgtick.config import Config
from pgtick.dbstate import METRICS_POOL_SIZE, DatabaseProbe
from pgtick.heartbeat import Heartbeat
from pgtick.http import HttpServer, observability_routes
from pgtick.listener import Listener
from pgtick.metrics import DatabaseCollector, Metrics, PoolStatsCollector, Readiness
from pgtick.reaper import Reaper
from pgtick.store import RunStore, WorkerInfo
from pgtick.systemd import Notifier
from pgtick.ticker import Ticker
from pgtick.worker import Worker

EXTRA_CONNECTIONS = 4  # heartbeat, reaper, ticker, completer beside the worker threads
MAIN_LOOP_SECONDS = 1.0
POST_CANCEL_WAIT_SECONDS = 2.5  # command handlers get SIGTERM, then SIGKILL after 2 s
COMPLETER_FLUSH_SECONDS = 1.5
LOOP_STALE_FACTOR = 3.0  # a loop is stuck after this many of its own intervals

log = structlog.get_logger("pgtick.service")


class SideLoop(Protocol):
    stop_event: threading.Event
    alive_at: float

    def run(self) -> None: ...


@dataclass
class LoopThread:
    """A side loop on its own thread; remembers how it ended."""

    name: str
    target: Callable[[], None]
    thread: threading.Thread = field(init=False)
    error: BaseException | None = None
    finished: bool = False

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._main, name=f"pgtick-{self.name}", daemon=True)

    def _main(self) -> None:
        try:
            self.target()
        except BaseException as exc:
            self.error = exc
            log.exception("loop_crashed", loop=self.name)
        finally:
            self.finished = True


def worker_id() -> str:
    """Unique per process: host, pid and a random suffix (pids are reused)."""
    return f"{handlers.hostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Service:
    """``pgtick run``: everything one daemon does, from start-up to a clean stop."""

    def __init__(
        self,
        config: Config,
        dsn: str,
        *,
        apply_migrations: bool = False,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.dsn = dsn
        logs.protect_dsn(dsn)  # psycopg's messages may quote it; no log line may show it
        self.apply_migrations = apply_migrations
        self.notifier = notifier or Notifier()
        self._stop = threading.Event()
        self._force = threading.Event()
        self._signals = 0
        self.worker_id = worker_id()
        self._http: HttpServer | None = None
        self._metrics_store: RunStore | None = None
        self._ticker: Ticker | None = None

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
        job_types = handlers.resolve(cfg)
        schema = cfg.database.schema
        if self.apply_migrations:
            applied = migrate.migrate(self.dsn, schema)
            if applied:
                log.info("migrations_applied", versions=applied)
        size = max(cfg.database.pool_size, cfg.worker.threads + EXTRA_CONNECTIONS)
        pool = db.make_pool(self.dsn, schema, size=size, name="pgtick")
        previous_signals = self._install_signals()
        try:
            with pool.connection() as conn, db.wrap_errors("schema check"):
                migrate.check_current(conn, schema)
            return self._serve(RunStore(pool), job_types)
        finally:
            for signum, handler in previous_signals.items():
                signal.signal(signum, handler)
            self._stop_http()
            pool.close(timeout=2.0)
            self.notifier.close()

    def _serve(self, store: RunStore, job_types: dict[str, handlers.JobType]) -> int:
        cfg = self.config
        metrics = Metrics(job_types, pgtick.__version__, cfg.worker.threads)
        self._start_http(store, metrics)
        worker = Worker(store, self.worker_id, cfg.worker, job_types, metrics)
        info = WorkerInfo(
            self.worker_id,
            handlers.hostname(),
            os.getpid(),
            pgtick.__version__,
            cfg.worker.threads,
            worker.handled,
        )
        store.register_worker(info)
        heartbeat = Heartbeat(store, worker, cfg.worker.heartbeat_seconds, metrics, info)
        listener = Listener(
            self.dsn, cfg.database.schema, set(worker.handled), worker.wake, metrics
        )
        reaper = Reaper(
            store,
            job_types,
            cfg.ticker.reaper_interval_seconds,
            cfg.worker.heartbeat_seconds,
            cfg.retention,
            metrics,
        )
        ticker = Ticker(store, list(cfg.schedules.values()), worker.handled, cfg.ticker, metrics)
        self._ticker = ticker
        ticker.sync()
        ticker.tick()  # READY=1 means the first tick is done
        loops = [
            LoopThread("heartbeat", heartbeat.run),
            LoopThread("listener", listener.run),
            LoopThread("reaper", reaper.run),
            LoopThread("ticker", ticker.run),
        ]
        for loop in loops:
            loop.thread.start()
        worker_threads = worker.start()
        log.info(
            "daemon_started",
            worker_id=self.worker_id,
            threads=cfg.worker.threads,
            job_types=handlers.handler_summary(job_types),
        )
        self.notifier.ready(self._status(worker))
        crashed = self._supervise(worker, worker_threads, loops, heartbeat, ticker)
        self._drain(worker, ticker, metrics)
        for side in (listener, reaper, ticker):
            side.stop_event.set()
        heartbeat.stop_event.set()
        for loop in loops:
            loop.thread.join(timeout=2.0)
        try:
            store.deregister_worker(self.worker_id)
        except pgtick.DatabaseError as exc:
            log.warning("deregister_failed", error=str(exc))
        log.info("daemon_stopped", worker_id=self.worker_id, exit_code=1 if crashed else 0)
        return 1 if crashed else 0

    def _start_http(self, store: RunStore, metrics: Metrics) -> None:
        """Serve /metrics, /healthz and /readyz from before READY=1 until the very end; the
        database-derived gauges use a small pool of their own so a busy worker pool cannot
        starve a scrape. ``metrics.listen = ""`` disables all of it."""
        cfg = self.config
        pools = {"pgtick": store.pool.get_stats}
        if not cfg.metrics.enabled:
            metrics.registry.register(PoolStatsCollector(pools))
            return
        metrics_pool = db.make_pool(
            self.dsn, cfg.database.schema, size=METRICS_POOL_SIZE, name="pgtick-metrics"
        )
        self._metrics_store = RunStore(metrics_pool)
        pools["pgtick-metrics"] = metrics_pool.get_stats
        metrics.registry.register(PoolStatsCollector(pools))
        probe = DatabaseProbe(
            self._metrics_store, list(cfg.schedules.values()), cfg.ticker.interval_seconds
        )
        collector = DatabaseCollector(
            probe, metrics.job_types, cfg.schedules, on_error=lambda: metrics.db_error("metrics")
        )
        metrics.registry.register(collector)
        readiness = Readiness(collector, self._last_tick_at, cfg.ticker.interval_seconds)
        routes = observability_routes(metrics, readiness)
        self._http = HttpServer("metrics.listen", cfg.metrics.host, cfg.metrics.port, routes)
        self._http.start()

    def _last_tick_at(self) -> float | None:
        return None if self._ticker is None else self._ticker.last_tick_at

    def _stop_http(self) -> None:
        if self._http is not None:
            self._http.stop()
        if self._metrics_store is not None:
            self._metrics_store.pool.close(timeout=2.0)

    def _status(self, worker: Worker) -> str:
        return (
            f"{worker.busy}/{self.config.worker.threads} busy, {worker.claimed_total} runs claimed"
        )

    def _supervise(
        self,
        worker: Worker,
        worker_threads: list[threading.Thread],
        loops: list[LoopThread],
        heartbeat: Heartbeat,
        ticker: Ticker,
    ) -> bool:
        """Watch the loops until asked to stop; True if one of them died."""
        interval = self.notifier.watchdog_interval_seconds or MAIN_LOOP_SECONDS
        wait = min(MAIN_LOOP_SECONDS, interval)
        while not self._stop.wait(wait):
            dead = [loop.name for loop in loops if loop.finished]
            dead += [t.name for t in worker_threads if not t.is_alive()]
            if dead:
                log.error("loop_died", loops=dead)
                return True
            stale = self._stale_loops(worker, heartbeat, ticker)
            if stale:
                log.warning("loops_stalled", loops=stale)
            else:
                self.notifier.watchdog()
            self.notifier.status(self._status(worker))
        return False

    def _stale_loops(self, worker: Worker, heartbeat: Heartbeat, ticker: Ticker) -> list[str]:
        """Loops that made no progress for several of their own intervals (stuck, e.g. on a
        hung connection): systemd's watchdog should then restart us. A loop that is merely
        retrying a database that went away still makes progress."""
        now = time.monotonic()
        cfg = self.config
        limits = {
            "heartbeat": (heartbeat.alive_at, cfg.worker.heartbeat_seconds),
            "dispatcher": (
                worker.dispatcher_alive_at,
                cfg.worker.poll_interval_seconds + db.POOL_OPEN_TIMEOUT_SECONDS,
            ),
            "ticker": (ticker.alive_at, cfg.ticker.interval_seconds),
        }
        return [
            name
            for name, (alive_at, interval) in limits.items()
            if now - alive_at > LOOP_STALE_FACTOR * max(interval, MAIN_LOOP_SECONDS)
        ]

    def _drain(self, worker: Worker, ticker: Ticker, metrics: Metrics) -> None:
        """SIGTERM: stop claiming, let handlers finish within the grace, release the rest."""
        grace = self.config.worker.shutdown_grace_seconds
        metrics.draining.set(1)
        self.notifier.stopping(f"draining: {worker.busy} running, grace {grace:g}s")
        log.info("draining", running=worker.busy, grace_seconds=grace)
        ticker.stop_event.set()
        worker.stop_claiming()
        released = worker.release_unstarted()
        finished = worker.wait_idle(grace, interrupt=self._force)
        if not finished:
            cancelled = worker.cancel_running()
            log.warning("grace_expired", cancelling=cancelled, forced=self._force.is_set())
            worker.wait_idle(POST_CANCEL_WAIT_SECONDS)
        worker.completer.wait_empty(COMPLETER_FLUSH_SECONDS)
        released += worker.release_held()
        worker.close()
        log.info("drained", released=released)
