"""Threads the composition runs beside the handler threads, and what watching them takes.

A side loop (heartbeat, listener, reaper, ticker) runs on a ``LoopThread`` that remembers how
it ended; whoever runs the loops (the one process of ``worker.processes = 1``, the supervisor,
a worker process) stops loudly when one dies, rather than limping on.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.lifecycle import Lifecycle
from pgtick.observability.systemd import Notifier

MAIN_LOOP_SECONDS = 1.0
LOOP_STALE_FACTOR = 3.0  # a loop is stuck after this many of its own intervals
SUMMARY_INTERVAL_SECONDS = 60.0  # the periodic INFO line of run outcomes per job type

log = structlog.get_logger("pgtick.service")
runs_log = structlog.get_logger("pgtick.runs")


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


def dead_threads(loops: list[LoopThread], threads: list[threading.Thread]) -> list[str]:
    """The names of the loops that ended and the threads that died."""
    dead = [loop.name for loop in loops if loop.finished]
    return dead + [t.name for t in threads if not t.is_alive()]


def stale_loops(limits: Mapping[str, tuple[float, float]]) -> list[str]:
    """Loops that made no progress for several of their own intervals (stuck, e.g. on a hung
    connection): {name: (alive_at, interval)}. A loop merely retrying a database that went
    away still makes progress."""
    now = time.monotonic()
    return [
        name
        for name, (alive_at, interval) in limits.items()
        if now - alive_at > LOOP_STALE_FACTOR * max(interval, MAIN_LOOP_SECONDS)
    ]


def log_summary(life: Lifecycle) -> None:
    """One INFO line per job type with what finished since the last one, if anything."""
    for job_type, counts in life.take_summary().items():
        runs_log.info("runs_summary", job_type=job_type, **counts)


def watch(
    stop: threading.Event,
    notifier: Notifier,
    dead: Callable[[], list[str]],
    stale: Callable[[], list[str]],
    status: Callable[[], str],
    summary: Callable[[], None],
    found_dead: list[str],
    also: Callable[[], bool] | None = None,
) -> bool:
    """The main thread's loop until ``stop``: a dead thread stops the process (True); the
    systemd watchdog is fed only while no loop is stuck; ``also`` (the supervisor's look at
    its worker processes) runs each round, True from it stops the process too."""
    interval = notifier.watchdog_interval_seconds or MAIN_LOOP_SECONDS
    wait = min(MAIN_LOOP_SECONDS, interval)
    next_summary = time.monotonic() + SUMMARY_INTERVAL_SECONDS
    while not stop.wait(wait):
        names = dead()
        if names:
            found_dead.extend(names)
            log.error(
                "loop_died",
                loops=names,
                message="a daemon thread died: stopping (systemd restarts the service)",
            )
            return True
        if also is not None and also():
            return True
        stuck = stale()
        if stuck:
            log.warning("loops_stalled", loops=stuck)
        else:
            notifier.watchdog()
        notifier.status(status())
        if time.monotonic() >= next_summary:
            next_summary = time.monotonic() + SUMMARY_INTERVAL_SECONDS
            summary()
    return False


def warn_if_no_job_types(cfg: Config, job_types: dict[str, handlers.JobType]) -> None:
    if not job_types:
        log.warning(
            "no_job_types",
            message="no job types: this daemon runs no jobs, it only ticks schedules; "
            "declare [job_types.NAME] or list @pgtick.job modules in worker.imports",
            config=cfg.path,
        )
