"""The half of a daemon that claims and runs: the worker pool (dispatcher, handler threads,
completer), the output flusher and the heartbeat, registered under one worker id. The one
process of ``worker.processes = 1`` runs it beside the once-per-daemon loops; each worker
process runs one of its own.
"""

from __future__ import annotations

import os
import threading
from typing import NoReturn

import psycopg_pool
import structlog

import pgtick
from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.heartbeat import Heartbeat
from pgtick.core.lifecycle import Held
from pgtick.core.output import Flusher, log_job_output
from pgtick.core.worker import Worker
from pgtick.observability.metrics import Metrics
from pgtick.observability.systemd import Notifier
from pgtick.observability.tracing import Tracing
from pgtick.service.drain import drain, exit_now, release_at_exit
from pgtick.service.loops import LoopThread, log_summary
from pgtick.storage import db
from pgtick.storage.store import RunStore, WorkerInfo
from pgtick.surfaces.operations.setup import HEARTBEAT_POOL_SIZE

log = structlog.get_logger("pgtick.service")


def beat_pool(dsn: str, config: Config) -> psycopg_pool.ConnectionPool[db.Connection]:
    """The heartbeat's one-connection pool. During an outage a beat fails at once rather than
    waiting for a connection, so that claims stop until the leases have been re-checked."""
    return db.make_pool(
        dsn,
        config.database.schema,
        size=HEARTBEAT_POOL_SIZE,
        name="pgtick-beat",
        checkout_timeout=min(config.worker.heartbeat_seconds, db.POOL_OPEN_TIMEOUT_SECONDS),
    )


class WorkSide:
    """Built registered (the workers row written), started by ``start``, ended by ``drain``
    then ``finish``."""

    def __init__(
        self,
        config: Config,
        store: RunStore,
        beat_store: RunStore,
        worker_id: str,
        job_types: dict[str, handlers.JobType],
        metrics: Metrics,
        *,
        log_each_run: bool,
        tracing: Tracing,
    ) -> None:
        cfg = config
        self.config = config
        self.store = store
        self.beat_store = beat_store
        self.worker_id = worker_id
        self.metrics = metrics
        self.flusher = Flusher(store, worker_id, log_job_output if cfg.logging.job_output else None)
        self.worker = Worker(
            store,
            worker_id,
            cfg.worker,
            job_types,
            metrics,
            log_each_run=log_each_run,
            flusher=self.flusher,
            tracing=tracing,
        )
        self.flusher.start()
        self.info = WorkerInfo(
            worker_id,
            handlers.hostname(),
            os.getpid(),
            pgtick.__version__,
            cfg.worker.threads,
            self.worker.handled,
        )
        store.register_worker(self.info)
        self.heartbeat = Heartbeat(
            beat_store, self.worker, cfg.worker.heartbeat_seconds, metrics, self.info
        )
        self.loop = LoopThread("heartbeat", self.heartbeat.run)

    def start_heartbeat(self) -> LoopThread:
        self.loop.thread.start()
        return self.loop

    def start_threads(self) -> list[threading.Thread]:
        """The dispatcher, the completer and the handler threads (watched by the caller)."""
        return self.worker.start()

    def status(self) -> str:
        return (
            f"{self.worker.busy}/{self.config.worker.threads} busy, "
            f"{self.worker.claimed_total} runs claimed"
        )

    def stale_limits(self) -> dict[str, tuple[float, float]]:
        """{loop: (alive_at, interval)} of the loops of this half (loops.stale_loops)."""
        w = self.config.worker
        return {
            "heartbeat": (self.heartbeat.alive_at, w.heartbeat_seconds),
            "dispatcher": (
                self.worker.dispatcher_alive_at,
                w.poll_interval_seconds + db.POOL_OPEN_TIMEOUT_SECONDS,
            ),
        }

    def drain(self, force: threading.Event, notifier: Notifier, at_exit: list[Held]) -> bool:
        """service.drain.drain on this half; False if some results could not be written."""
        grace = self.config.worker.shutdown_grace_seconds
        return drain(self.worker, grace, force, self.metrics, notifier, at_exit)

    def finish(self, at_exit: list[Held]) -> None:
        """After the drain: the last summary line, the flusher stopped; then the heartbeat
        stopped and the workers row removed, unless runs wait for the exit (``at_exit``):
        their handlers still run, so the heartbeat renews their leases until the process
        ends (exit_releasing; seed 4318: the joins after the drain outlasted a lease)."""
        log_summary(self.worker.life)
        self.flusher.stop()
        if not at_exit:
            self._stop_beating()
            self._deregister()

    def exit_releasing(self, at_exit: list[Held], code: int) -> NoReturn:
        """The last act when Python handlers still run: remove the workers row, give their
        runs back (release_at_exit) and end the process at once, its handlers' threads with
        it. The heartbeat renews their leases until the process ends (it no longer registers
        again): stopped first, a deregistration that waited 15 s for a connection let the
        leases end while the handlers ran, and a reaper ran second copies (seed 4318). Both
        statements go through the heartbeat's own connection, which was working a beat ago."""
        self.heartbeat.leaving = True
        self._deregister(self.beat_store)
        release_at_exit(self.worker, at_exit, self.beat_store)
        exit_now(code)

    def _stop_beating(self) -> None:
        self.heartbeat.stop()
        self.loop.thread.join(timeout=2.0)

    def _deregister(self, store: RunStore | None = None) -> None:
        try:
            (store or self.store).deregister_worker(self.worker_id)
        except pgtick.DatabaseError as exc:
            log.warning("deregister_failed", error=str(exc))
