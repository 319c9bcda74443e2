"""The composition root: builds the pool, wires the loops, owns signals and shutdown.

Only this module knows all the parts. Side loops (dispatcher, completer, heartbeat, listener,
reaper, ticker) and the handler threads run on threads; if one dies the service stops loudly
(exit 1) rather than limping on, and systemd restarts it.

``Service`` stays one class (some 430 lines), and this module some 540 lines with
it: it is the wiring itself, start-up order and shutdown order in one place, each step
undoing what an earlier one built.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, NoReturn, Protocol

import structlog

import pgtick
from pgtick.config import Config, read_token, read_viewer_token
from pgtick.core import handlers
from pgtick.core.dbstate import METRICS_POOL_SIZE, DatabaseProbe
from pgtick.core.heartbeat import Heartbeat
from pgtick.core.lifecycle import Held
from pgtick.core.listener import Listener
from pgtick.core.output import Flusher, log_job_output
from pgtick.core.reaper import Reaper
from pgtick.core.ticker import Ticker
from pgtick.core.worker import Worker, claim_type
from pgtick.observability import logs, tracing
from pgtick.observability.database import DatabaseCollector, PoolStatsCollector, Readiness
from pgtick.observability.metrics import Metrics
from pgtick.observability.outage import tell_pool_warnings
from pgtick.observability.systemd import Notifier
from pgtick.storage import db, migrate
from pgtick.storage.store import ClaimType, RunStore, WorkerInfo
from pgtick.surfaces.console.routes import SECURITY_HEADERS, Console
from pgtick.surfaces.console.server import ConsoleServer
from pgtick.surfaces.http import HttpServer, observability_routes
from pgtick.surfaces.operations.setup import (
    HEARTBEAT_POOL_SIZE,
    WEB_POOL_SIZE,
    database_checks,
    pool_size,
    startup_checks,
)

# Beside one connection per handler thread (ctx.transaction()): the dispatcher's and the
# completer's pinned connections, the reaper, the ticker, and one for short statements
# (effect_once outside a transaction, releases). The heartbeat has a pool of its own.
MAIN_LOOP_SECONDS = 1.0
DISPATCHER_JOIN_SECONDS = 5.0  # a claim in flight returns within a statement's time
# At the end of the drain, how long the results of handlers that returned may take to be
# written (a database that is slow or away); what is still unwritten then is logged by run id
# and the exit code is 1: those runs stay `running` until the reaper recovers them.
RESULTS_FLUSH_SECONDS = 10.0
POST_CANCEL_WAIT_SECONDS = 1.0  # for Python handlers to notice ctx.cancelled
# The runs of Python handlers still running at the end of a drain are given back as the
# process's last act and due no sooner than this: the process ends within microseconds of the
# release, its handlers with it, before any other daemon may start them.
EXIT_HOLD_SECONDS = 2.0
SUMMARY_INTERVAL_SECONDS = 60.0  # the periodic INFO line of run outcomes per job type
LOOP_STALE_FACTOR = 3.0  # a loop is stuck after this many of its own intervals

PREPARED_STATEMENTS_OFF = (
    "prepared statements off: database.dsn goes through a connection pooler, where a statement"
    " prepared on one server connection is missing on the next; database.prepared_statements ="
    " true applies to direct connections only (set it to false to say so)"
)

log = structlog.get_logger("pgtick.service")
runs_log = structlog.get_logger("pgtick.runs")


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
        self._http: HttpServer | None = None
        self._metrics_store: RunStore | None = None
        self._web: ConsoleServer | None = None
        self._web_store: RunStore | None = None
        self._ticker: Ticker | None = None
        self._dead: list[str] = []  # threads found dead by the supervisor
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
        size = pool_size(cfg)
        with db.connect(self.dsn, schema) as conn:
            database_checks(cfg, conn)
            prepare = self._prepare_statements(conn)
        pool = db.make_pool(self.dsn, schema, size=size, name="pgtick", prepare=prepare)
        beat_pool = db.make_pool(
            self.dsn,
            schema,
            size=HEARTBEAT_POOL_SIZE,
            name="pgtick-beat",
            # During an outage a beat fails at once rather than waiting for a connection, so
            # that claims stop until the leases have been re-checked.
            checkout_timeout=min(cfg.worker.heartbeat_seconds, db.POOL_OPEN_TIMEOUT_SECONDS),
        )
        previous_signals = self._install_signals()
        try:
            return self._serve(RunStore(pool), RunStore(beat_pool), job_types)
        finally:
            for signum, handler in previous_signals.items():
                signal.signal(signum, handler)
            self._stop_http()
            self._tracing.shutdown()  # the spans of the last attempts, sent
            beat_pool.close(timeout=2.0)
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
        cfg = self.config
        metrics = Metrics(job_types, pgtick.__version__, cfg.worker.threads)
        tell_pool_warnings(metrics.outage)  # one outage, told once (outage.py)
        limits = [
            t for jt in job_types.values() if (t := claim_type(jt.config, jt.lease_seconds)).limited
        ]
        self._start_http(store, metrics, limits)
        self._start_web(limits)
        flusher = Flusher(store, self.worker_id, log_job_output if cfg.logging.job_output else None)
        # After startup_checks imported the handler modules: one that set a tracer provider
        # of its own keeps it (otel.py).
        self._tracing = tracing.start(cfg.tracing.enabled, pgtick.__version__)
        if self._tracing.enabled:
            log.info("tracing_enabled")
        worker = Worker(
            store,
            self.worker_id,
            cfg.worker,
            job_types,
            metrics,
            log_each_run=self.log_each_run,
            flusher=flusher,
            tracing=self._tracing,
        )
        flusher.start()
        info = WorkerInfo(
            self.worker_id,
            handlers.hostname(),
            os.getpid(),
            pgtick.__version__,
            cfg.worker.threads,
            worker.handled,
        )
        store.register_worker(info)
        heartbeat = Heartbeat(beat_store, worker, cfg.worker.heartbeat_seconds, metrics, info)
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
        reaper = Reaper(
            store,
            job_types,
            cfg.ticker.reaper_interval_seconds,
            cfg.worker.heartbeat_seconds,
            cfg.retention,
            metrics,
        )
        priorities = {name: jt.config.priority for name, jt in job_types.items()}
        ticker = Ticker(
            store,
            list(cfg.schedules.values()),
            worker.handled,
            cfg.ticker,
            metrics,
            priorities=priorities,
            service=cfg.worker.service,
        )
        self._ticker = ticker
        store.sync_job_type_settings(
            priorities, {name: jt.config.follow for name, jt in job_types.items()}
        )
        # Before the first claim: the partitions this daemon's finished runs go to (the
        # reaper's retention passes keep them ahead from here on).
        reaper.prune_once()
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
        if not job_types:
            log.warning(
                "no_job_types",
                message="no job types: this daemon runs no jobs, it only ticks schedules; "
                "declare [job_types.NAME] or list @pgtick.job modules in worker.imports",
                config=cfg.path,
            )
        self.notifier.ready(self._status(worker))
        crashed = self._supervise(worker, worker_threads, loops, heartbeat, ticker)
        at_exit: list[Held] = []
        crashed = not self._drain(worker, ticker, metrics, at_exit) or crashed
        self._log_summary(worker)
        for side in (listener, reaper, ticker):
            side.stop_event.set()
        heartbeat.stop()
        flusher.stop()
        for loop in loops:
            loop.thread.join(timeout=2.0)
        try:
            store.deregister_worker(self.worker_id)
        except pgtick.DatabaseError as exc:
            log.warning("deregister_failed", error=str(exc))
        log.info("daemon_stopped", worker_id=self.worker_id, exit_code=1 if crashed else 0)
        if at_exit:
            _release_and_exit(worker, at_exit, 1 if crashed else 0)
        return 1 if crashed else 0

    def _start_http(
        self, store: RunStore, metrics: Metrics, limits: Sequence[ClaimType] = ()
    ) -> None:
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
            self._metrics_store,
            list(cfg.schedules.values()),
            cfg.ticker.interval_seconds,
            limits=limits,
        )
        collector = DatabaseCollector(
            probe,
            metrics.job_types,
            cfg.schedules,
            other_job_types=cfg.metrics.other_job_types,
            on_error=lambda: metrics.db_error("metrics"),
        )
        metrics.registry.register(collector)
        readiness = Readiness(
            collector, self._last_tick_at, cfg.ticker.interval_seconds, problem=self._problem
        )
        routes = observability_routes(metrics, readiness)
        self._http = HttpServer("metrics.listen", cfg.metrics.host, cfg.metrics.port, routes)
        self._http.start()

    def _start_web(self, limits: Sequence[ClaimType] = ()) -> None:
        """Serve the console (``web.listen``) on a small pool of its own, so that a page load
        never takes a connection a worker or a scrape is waiting for."""
        web = self.config.web
        if not web.enabled:
            return
        token = read_token(web)
        viewer_token = read_viewer_token(web)
        pool = db.make_pool(
            self.dsn, self.config.database.schema, size=WEB_POOL_SIZE, name="pgtick-web"
        )
        self._web_store = RunStore(pool)
        console = Console(
            self._web_store,
            token,
            viewer_token=viewer_token,
            heartbeat_seconds=self.config.worker.heartbeat_seconds,
            tick_interval_seconds=self.config.ticker.interval_seconds,
            listen_host=web.host,
            hosts=web.hosts,
            session_ttl_seconds=web.session_ttl_seconds,
            public_reads=web.public_reads,
            limits=limits,
        )
        routes = console.routes()
        self._web = ConsoleServer("web.listen", web.host, web.port, routes, SECURITY_HEADERS)
        self._web.start()
        log.info("console_listening", url=f"http://{web.listen}/", actions=token is not None)

    def _problem(self) -> str | None:
        """Why this daemon is not ready beyond the database and the ticker: a dead thread."""
        if self._dead:
            return f"threads died: {', '.join(self._dead)} (stopping)"
        return None

    def _last_tick_at(self) -> float | None:
        return None if self._ticker is None else self._ticker.last_tick_at

    def _stop_http(self) -> None:
        """The metrics server, then the console, last of all."""
        if self._http is not None:
            self._http.stop()
        if self._metrics_store is not None:
            self._metrics_store.pool.close(timeout=2.0)
        if self._web is not None:
            self._web.stop()
        if self._web_store is not None:
            self._web_store.pool.close(timeout=2.0)

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
        next_summary = time.monotonic() + SUMMARY_INTERVAL_SECONDS
        while not self._stop.wait(wait):
            dead = [loop.name for loop in loops if loop.finished]
            dead += [t.name for t in worker_threads if not t.is_alive()]
            if dead:
                self._dead = dead
                log.error(
                    "loop_died",
                    loops=dead,
                    message="a daemon thread died: stopping (systemd restarts the service)",
                )
                return True
            stale = self._stale_loops(worker, heartbeat, ticker)
            if stale:
                log.warning("loops_stalled", loops=stale)
            else:
                self.notifier.watchdog()
            self.notifier.status(self._status(worker))
            if time.monotonic() >= next_summary:
                next_summary = time.monotonic() + SUMMARY_INTERVAL_SECONDS
                self._log_summary(worker)
        return False

    @staticmethod
    def _log_summary(worker: Worker) -> None:
        """One INFO line per job type with what finished since the last one, if anything."""
        for job_type, counts in worker.life.take_summary().items():
            runs_log.info("runs_summary", job_type=job_type, **counts)

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

    def _drain(self, worker: Worker, ticker: Ticker, metrics: Metrics, at_exit: list[Held]) -> bool:
        """SIGTERM: stop claiming, let handlers finish within the grace, stop the rest, and
        release a run only once its handler (and a command's whole process group) is gone;
        then wait for every result to be written. False if some could not be. The runs of
        Python handlers that ignored the cancel go into ``at_exit``: they run until the
        process ends, so they are released at its very end (_release_and_exit)."""
        grace = self.config.worker.shutdown_grace_seconds
        life = worker.life
        finished_before = life.finished_total
        metrics.draining.set(1)
        running = worker.busy
        self.notifier.stopping(f"draining: {running} running, grace {grace:g}s")
        log.info(
            "draining",
            running=running,
            grace_seconds=grace,
            message=f"waiting up to {grace:g}s for {running} running run(s); "
            "a second SIGTERM or SIGINT stops them at once",
        )
        ticker.stop_event.set()
        if not worker.stop_claiming(DISPATCHER_JOIN_SECONDS):
            log.warning("dispatcher_still_claiming")  # its claims are refused and released
        released = worker.release_unstarted() + worker.released_after_close
        if not life.wait_idle(grace, interrupt=self._force):
            stopping = life.interrupt()
            log.warning(
                "stopping_handlers",
                handlers=stopping,
                forced=self._force.is_set(),
                kill_timeout_seconds=handlers.COMMAND_STOP_TIMEOUT_SECONDS,
            )
            # Python handlers that watch ctx.cancelled return now; one that does not dies
            # with this process. A command may take the whole kill timeout to be gone, and
            # its run is released only after that.
            life.wait_idle(POST_CANCEL_WAIT_SECONDS)
            if not life.wait_idle(handlers.COMMAND_STOP_TIMEOUT_SECONDS, commands_only=True):
                log.error("commands_still_running", handlers=worker.busy)
        report = life.leftovers()
        released += worker.release(report.release)
        worker.fail_timed_out(report.timed_out)
        at_exit.extend(report.at_exit)
        for held in report.left_running:
            log.error(
                "run_left_running",
                run_id=held.id,
                job_type=held.run.job_type,
                reason="its command outlived the kill timeout; the lease expires and the "
                "reaper decides",
            )
        worker.close()
        unwritten = worker.wait_written(RESULTS_FLUSH_SECONDS)
        if unwritten:
            log.error(
                "results_not_written",
                runs=sorted(unwritten),
                reason=f"the database did not take them within {RESULTS_FLUSH_SECONDS:g}s; "
                "the runs stay running until their leases expire and the reaper decides",
            )
        log.info(
            "drained",
            finished=life.finished_total - finished_before,
            released=released,
            left_running=len(report.left_running),
            unwritten=len(unwritten),
        )
        return not unwritten


def _release_and_exit(worker: Worker, runs: list[Held], code: int) -> NoReturn:
    """The process's last act when Python handlers still run (they ignored the cancel): give
    their runs back, due ``EXIT_HOLD_SECONDS`` from now, and end the process at once, the
    handlers' threads with it, so that no other daemon starts a run while its first copy
    still runs here (docs/guarantees.md). Released any earlier, they ran beside their next
    claim for as long as this process took to end (issue 43)."""
    released = worker.release(runs, hold_seconds=EXIT_HOLD_SECONDS)
    log.info(
        "released_at_exit",
        released=released,
        runs=sorted(h.id for h in runs),
        due_in_seconds=EXIT_HOLD_SECONDS,
        reason="their Python handlers ignored the cancel and end with this process",
    )
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
