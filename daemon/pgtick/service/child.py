"""A worker process (``worker.processes`` above 1): one ``WorkSide`` with its own pools, thread
pool and worker id, started by the supervisor with multiprocessing's "spawn" context (a fresh
interpreter: no psycopg connection, lock or thread is inherited through a fork) and driven
over one pipe.

The pipe carries, from the supervisor: NOTIFYs relayed by its LISTEN connection (``wake`` to
one process, the bounds and controls to all), ``drain`` (SIGTERM) and ``force`` (the second
SIGTERM); to it: ``ready``, a ``status`` a second, ``backlog`` (a claim came back full: the
supervisor wakes another process, so a backlog spreads one wake-up at a time), and
``recycle`` (the limits of
``worker.max_runs_per_process`` / ``worker.max_memory_mib`` reached: this process drains like
on SIGTERM and the supervisor starts its successor at once). The end of the pipe is the
supervisor's death: the process then stops at once (``force``), gives back what it holds and
exits, so that no orphan keeps a lease. SIGTERM and SIGINT (systemd and a terminal send them
to every process of the unit) are a warm stop only: the cold one comes through the pipe.
"""

from __future__ import annotations

import math
import signal
import threading
import time
import types
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import structlog

import pgtick
from pgtick.config import Config
from pgtick.core.controls import SAFETY_REFRESH_SECONDS
from pgtick.core.heartbeat import Heartbeat
from pgtick.core.lifecycle import Held
from pgtick.core.worker import Worker
from pgtick.observability import logs, tracing
from pgtick.observability.metrics import Metrics
from pgtick.observability.outage import tell_pool_warnings
from pgtick.observability.systemd import Notifier
from pgtick.service.drain import exit_now
from pgtick.service.loops import dead_threads, log_summary, stale_loops
from pgtick.service.work import WorkSide, beat_pool
from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces.operations.setup import pool_size, startup_checks

# After the supervisor died, the longest this process may take to give back its runs and
# exit: past it, it exits anyway (its leases then expire and the reaper decides).
ORPHAN_EXIT_SECONDS = 15.0
# While its claims come back full, this process asks the supervisor to wake another one at
# most this often: a backlog spreads over the processes one wake-up at a time, no herd.
BACKLOG_TELL_SECONDS = 0.05
# The supervisor tells whether it relays NOTIFYs every second (its main loop): past this
# long without a word it is taken as not relaying (stopped with SIGSTOP, hung), and this
# process reads the controls and probes for due runs by its poll interval, as without LISTEN.
RELAY_STALE_SECONDS = 3.0
MIB = 1024 * 1024

log = structlog.get_logger("pgtick.service")


def frozen_mapping(items: dict[str, Any]) -> Mapping[str, Any]:
    return types.MappingProxyType(items)


# The config's tables are read-only mappings, which pickle cannot send as they are.
ForkingPickler.register(types.MappingProxyType, lambda m: (frozen_mapping, (dict(m),)))


@dataclass(frozen=True)
class ChildSpec:
    """What a worker process needs from its supervisor (pickled to it)."""

    config: Config
    dsn: str
    slot: int  # 1..worker.processes, for the logs
    worker_id: str
    prepare: bool
    log_format: str
    log_level: str
    log_each_run: bool
    metrics_dir: str
    processes: int  # worker.processes: each claims its share out of idle (worker.fair_share)


def rss_bytes() -> int | None:
    """This process's resident memory (Linux /proc), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _page_size()
    except (OSError, ValueError, IndexError):
        return None


def _page_size() -> int:
    import resource

    return resource.getpagesize()


class _Outbox:
    """Messages to the supervisor, from the main thread and the dispatcher alike."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._backlog_at = -math.inf

    def send(self, *message: Any) -> bool:
        """False once the supervisor is gone (the inbox stops this process)."""
        with self._lock:
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                return False
            return True

    def backlog(self) -> None:
        now = time.monotonic()
        if now - self._backlog_at >= BACKLOG_TELL_SECONDS:
            self._backlog_at = now
            self.send("backlog")


class _Inbox:
    """Reads the supervisor's messages on a thread of its own."""

    def __init__(self, conn: Connection, stop: threading.Event, force: threading.Event) -> None:
        self._conn = conn
        self._stop = stop
        self._force = force
        self._listening = False
        self._told_at = -math.inf  # monotonic: the supervisor's last word on it
        self.worker: Worker | None = None
        self.heartbeat: Heartbeat | None = None

    @property
    def listening(self) -> bool:
        """The supervisor relays NOTIFYs: it said so within ``RELAY_STALE_SECONDS``."""
        return self._listening and time.monotonic() - self._told_at < RELAY_STALE_SECONDS

    def run(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                self._orphaned()
                return
            self._handle(message)

    def _orphaned(self) -> None:
        """The supervisor is gone: stop at once, and exit in any case soon after."""
        if self._stop.is_set() and self._force.is_set():
            return
        log.error("supervisor_gone", message="the supervisor process died: stopping at once")
        self._stop.set()
        self._force.set()
        timer = threading.Timer(ORPHAN_EXIT_SECONDS, exit_now, args=(1,))
        timer.daemon = True
        timer.start()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        worker = self.worker
        if kind == "drain":
            self._stop.set()
        elif kind == "force":
            self._stop.set()
            self._force.set()
        elif kind == "listening":
            self._listening = bool(message[1])
            self._told_at = time.monotonic()
        elif worker is None:
            return  # not started yet: its first claim catches up anyway
        elif kind == "wake":
            worker.notified()
        elif kind == "due":
            worker.due(message[1], datetime.fromtimestamp(message[2], UTC))
        elif kind == "bound":
            worker.bounds.lower(message[1], datetime.fromtimestamp(message[2], UTC))
        elif kind == "rescan":
            worker.rescan()
        elif kind == "controls":
            worker.controls_changed()
        elif kind == "beat" and self.heartbeat is not None:
            self.heartbeat.ask()


def main(spec: ChildSpec, conn: Connection) -> None:
    """The worker process's entry point (multiprocessing target); exits with its code."""
    stop = threading.Event()
    force = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logs.configure_logging(spec.log_format, spec.log_level)
    logs.protect_dsn(spec.dsn)
    inbox = _Inbox(conn, stop, force)
    threading.Thread(target=inbox.run, name="pgtick-inbox", daemon=True).start()
    exit_now(_serve(spec, _Outbox(conn), inbox, stop, force))


def _serve(
    spec: ChildSpec,
    out: _Outbox,
    inbox: _Inbox,
    stop: threading.Event,
    force: threading.Event,
) -> int:
    cfg = spec.config
    job_types = startup_checks(cfg)  # imports the handlers, in this interpreter
    metrics = Metrics(
        job_types, pgtick.__version__, cfg.worker.threads, multiprocess_dir=spec.metrics_dir
    )
    tell_pool_warnings(metrics.outage)
    schema = cfg.database.schema
    pool = db.make_pool(spec.dsn, schema, size=pool_size(cfg), name="pgtick", prepare=spec.prepare)
    beats = beat_pool(spec.dsn, cfg)
    spans = tracing.start(cfg.tracing.enabled, pgtick.__version__)
    try:
        work = WorkSide(
            cfg,
            RunStore(pool),
            RunStore(beats),
            spec.worker_id,
            job_types,
            metrics,
            log_each_run=spec.log_each_run,
            tracing=spans,
        )
        worker = work.worker
        worker.bounds.notifying = lambda: inbox.listening
        worker.controls.notifying = lambda: inbox.listening
        inbox.worker = worker
        # Holding no run, this process does not beat: the supervisor does (service/beats.py).
        work.heartbeat.idle_beats_elsewhere = True
        inbox.heartbeat = work.heartbeat
        worker.on_backlog = out.backlog
        worker.processes = spec.processes
        # Like the poll interval (supervisor._spec): the daemon as a whole makes up for a
        # missed !controls NOTIFY as often as one process did, however many there are.
        worker.controls.safety_seconds = SAFETY_REFRESH_SECONDS * spec.processes
        loops = [work.start_heartbeat()]
        threads = work.start_threads()
        worker.wake()  # NOTIFYs sent before the inbox knew the worker: claim once now
        out.send("ready", spec.worker_id)
        log.info(
            "worker_process_started",
            worker_id=spec.worker_id,
            slot=spec.slot,
            threads=cfg.worker.threads,
        )
        found_dead: list[str] = []
        crashed = False
        while not stop.wait(1.0):
            dead = dead_threads(loops, threads)
            if dead:
                found_dead.extend(dead)
                log.error("loop_died", loops=dead, message="a worker process thread died")
                crashed = True
                break
            stuck = stale_loops(work.stale_limits())
            if stuck:
                log.warning("loops_stalled", loops=stuck)
            if _report(spec, out, work, metrics):
                break  # recycled: drained like on SIGTERM
        if found_dead:
            out.send("problem", f"threads died: {', '.join(found_dead)}")
        at_exit: list[Held] = []
        crashed = not work.drain(force, Notifier({}), at_exit) or crashed
        work.finish(at_exit)
        code = 1 if crashed else 0
        log.info("worker_process_stopped", worker_id=spec.worker_id, exit_code=code)
        if at_exit:
            work.exit_releasing(at_exit, code)
        log_summary(worker.life)
        return code
    finally:
        spans.shutdown()
        beats.close(timeout=2.0)
        pool.close(timeout=2.0)


def _report(spec: ChildSpec, out: _Outbox, work: WorkSide, metrics: Metrics) -> bool:
    """A second's status to the supervisor and the process's own gauges; True (a recycle,
    told to the supervisor) when a limit of worker.max_runs_per_process or
    worker.max_memory_mib is reached."""
    worker = work.worker
    rss = rss_bytes()
    metrics.sample_process(worker.busy, rss)
    finished = worker.life.finished_total
    leased = len(worker.life.leases())  # none: the supervisor beats for this process
    if not out.send("status", worker.busy, worker.claimed_total, finished, leased):
        return False  # the supervisor is gone: the inbox stops us
    w = spec.config.worker
    reason = None
    if w.max_runs_per_process and finished >= w.max_runs_per_process:
        limit = w.max_runs_per_process
        reason = f"{finished} runs finished (worker.max_runs_per_process = {limit})"
    elif w.max_memory_mib and rss is not None and rss >= w.max_memory_mib * MIB:
        reason = f"{rss // MIB} MiB resident (worker.max_memory_mib = {w.max_memory_mib})"
    if reason is None:
        return False
    log.info("worker_process_recycling", worker_id=spec.worker_id, reason=reason)
    out.send("recycle", reason)
    return True
