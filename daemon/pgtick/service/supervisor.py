"""The supervisor process of ``worker.processes`` above 1 (docs/architecture.md, "The process
model"): it owns what exists once per daemon (the ticker, the reaper and retention, the
LISTEN connection, sd_notify and the watchdog, the HTTP listeners, the signals, the beat of
the idle worker processes) and runs no handler itself; the worker processes (``children``)
claim, run, heartbeat and finish.

Its LISTEN connection relays each NOTIFY to one worker process (round-robin), so one enqueue
wakes one claim per daemon, not one per process. Its ``/metrics`` reads every process's
series from a private directory, created at start and removed at exit (metrics.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
import threading

import structlog

import pgtick
from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.handlers import COMMAND_STOP_TIMEOUT_SECONDS
from pgtick.core.listener import Listener
from pgtick.core.worker import claim_type
from pgtick.observability.metrics import Metrics
from pgtick.observability.outage import tell_pool_warnings
from pgtick.observability.systemd import Notifier
from pgtick.service.beats import IdleBeats
from pgtick.service.child import ChildSpec
from pgtick.service.children import Children
from pgtick.service.drain import DISPATCHER_JOIN_SECONDS, RESULTS_FLUSH_SECONDS
from pgtick.service.endpoints import Endpoints
from pgtick.service.loops import (
    LoopThread,
    dead_threads,
    stale_loops,
    warn_if_no_job_types,
    watch,
)
from pgtick.service.once import OnceSide
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces.operations.setup import SUPERVISOR_POOL_SIZE

# How long the worker processes may take to start before READY=1 is sent anyway (they are
# restarted with back-off meanwhile, and /readyz says which one is missing).
STARTUP_WAIT_SECONDS = 60.0
# Beyond the drain's own bounds, what a worker process may take to exit before it is killed.
DRAIN_MARGIN_SECONDS = 10.0

log = structlog.get_logger("pgtick.service")


class Supervisor:
    """One daemon's supervisor; ``run`` returns the exit code."""

    def __init__(
        self,
        config: Config,
        dsn: str,
        job_types: dict[str, handlers.JobType],
        *,
        notifier: Notifier,
        prepare: bool,
        log_each_run: bool,
    ) -> None:
        self.config = config
        self.dsn = dsn
        self.job_types = job_types
        self.notifier = notifier
        self.prepare = prepare
        self.log_each_run = log_each_run
        self.count = config.worker.process_count
        self._dead: list[str] = []
        self._children: Children | None = None
        self._once: OnceSide | None = None
        self._metrics_dir = ""

    def run(self, stop: threading.Event, force: threading.Event) -> int:
        cfg = self.config
        # A private directory for every process's series, fresh at each start.
        self._metrics_dir = tempfile.mkdtemp(prefix="pgtick-metrics-")
        endpoints = Endpoints(cfg, self.dsn)
        pool = db.make_pool(
            self.dsn, cfg.database.schema, size=SUPERVISOR_POOL_SIZE, name="pgtick-supervisor"
        )
        try:
            return self._serve(RunStore(pool), endpoints, stop, force)
        finally:
            endpoints.stop()
            pool.close(timeout=2.0)
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _serve(
        self, store: RunStore, endpoints: Endpoints, stop: threading.Event, force: threading.Event
    ) -> int:
        cfg = self.config
        metrics = Metrics(self.job_types, pgtick.__version__, 0, multiprocess_dir=self._metrics_dir)
        tell_pool_warnings(metrics.outage)
        limits = [
            t
            for jt in self.job_types.values()
            if (t := claim_type(jt.config, jt.lease_seconds)).limited
        ]
        endpoints.start_http(
            {"pgtick-supervisor": store.pool.get_stats},
            metrics,
            limits,
            self._last_tick_at,
            self._problem,
        )
        endpoints.start_web(limits)
        once = self._once = OnceSide(cfg, store, self.job_types, metrics)
        once.prepare()
        children = self._children = Children(
            self.count, self._spec, metrics, once.reaper.reap_holder
        )
        listener = Listener(
            self.dsn,
            cfg.database.schema,
            set(self.job_types),
            children.wake,
            metrics,
            listen_dsn=cfg.database.listen_dsn,
            on_rescan=children.rescan,
            on_due=children.due,
            on_controls=children.controls,
        )
        beats = IdleBeats(store, children, cfg.worker.heartbeat_seconds, metrics)
        loops = [LoopThread("listener", listener.run), LoopThread("beats", beats.run)]
        loops += once.loops()
        children.start()
        for loop in loops:
            loop.thread.start()
        log.info(
            "daemon_started",
            supervisor_pid=os.getpid(),
            processes=self.count,
            threads=cfg.worker.threads,
            job_types=handlers.handler_summary(self.job_types),
        )
        warn_if_no_job_types(cfg, self.job_types)
        waited = 0.0
        while not stop.is_set() and not children.all_ready() and waited < STARTUP_WAIT_SECONDS:
            children.listening(listener.connected)
            stop.wait(0.05)
            waited += 0.05
        self.notifier.ready(children.status(cfg.worker.threads))

        def tend() -> bool:
            children.listening(listener.connected)
            return False

        crashed = watch(
            stop,
            self.notifier,
            lambda: dead_threads(loops, [children.thread]),
            lambda: stale_loops({"ticker": (once.ticker.alive_at, cfg.ticker.interval_seconds)}),
            lambda: children.status(cfg.worker.threads),
            lambda: None,  # each worker process logs its own summary
            self._dead,
            also=tend,
        )
        once.ticker.stop_event.set()
        metrics.draining.set(1)
        grace = cfg.worker.shutdown_grace_seconds
        self.notifier.stopping(f"draining {self.count} worker processes, grace {grace:g}s")
        log.info(
            "draining",
            processes=self.count,
            grace_seconds=grace,
            message=f"waiting up to {grace:g}s for the worker processes' running runs; "
            "a second SIGTERM or SIGINT stops them at once",
        )
        bound = (
            grace
            + DISPATCHER_JOIN_SECONDS
            + COMMAND_STOP_TIMEOUT_SECONDS
            + RESULTS_FLUSH_SECONDS
            + DRAIN_MARGIN_SECONDS
        )
        children.drain(force, bound)
        listener.stop_event.set()
        beats.stop_event.set()
        once.stop()
        for loop in loops:
            loop.thread.join(timeout=2.0)
        crashed = crashed or any(code != 0 for code in children.exit_codes)
        code = 1 if crashed else 0
        log.info("daemon_stopped", exit_code=code, processes=self.count)

        return code

    def _spec(self, slot: int, worker_id: str) -> ChildSpec:
        """What worker process ``slot`` runs with. Its poll interval is ``worker.poll_interval``
        times the processes: idle, the daemon as a whole probes as often as one process did
        (issue 47: at most a query a second whatever N); a NOTIFY still wakes one of them
        within milliseconds, and a run due later is claimed when due (the probe says when)."""
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        w = self.config.worker
        config = dataclasses.replace(
            self.config,
            worker=dataclasses.replace(
                w, poll_interval_seconds=w.poll_interval_seconds * self.count
            ),
        )
        return ChildSpec(
            config=config,
            dsn=self.dsn,
            slot=slot,
            worker_id=worker_id,
            prepare=self.prepare,
            log_format=self.config.logging.format,
            log_level=level if level in ("debug", "info", "warning", "error") else "info",
            log_each_run=self.log_each_run,
            metrics_dir=self._metrics_dir,
            processes=self.count,
        )

    def _problem(self) -> str | None:
        """Why this daemon is not ready beyond the database and the ticker: a dead thread
        here, or a worker process missing, starting or broken."""
        if self._dead:
            return f"threads died: {', '.join(self._dead)} (stopping)"
        return None if self._children is None else self._children.problem()

    def _last_tick_at(self) -> float | None:
        return None if self._once is None else self._once.last_tick_at()
