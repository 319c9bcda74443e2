"""The warm stop of a process that runs handlers (the one process, or a worker process): stop
claiming, let handlers finish within ``worker.shutdown_grace``, stop the rest, release what did
not finish, write every result; and, as its very last act, give back the runs of Python
handlers that ignored the cancel.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import NoReturn

import structlog

from pgtick.core import handlers
from pgtick.core.lifecycle import Held, State
from pgtick.core.worker import Worker
from pgtick.observability.metrics import Metrics
from pgtick.observability.systemd import Notifier
from pgtick.storage.store import RunStore

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
# ... and each waits this long at most for its row's lock: one release of them all that
# waited for an operator's lock (the heartbeat stopped then) let the leases of the others end
# while their handlers still ran here, and another daemon's reaper started second copies
# (seeds 4324 and 4318). A run not given back is left to the reaper, after this process (and
# its handler) died.
EXIT_LOCK_WAIT_MS = 100

log = structlog.get_logger("pgtick.service")


def drain(
    worker: Worker,
    grace: float,
    force: threading.Event,
    metrics: Metrics,
    notifier: Notifier,
    at_exit: list[Held],
) -> bool:
    """SIGTERM: stop claiming, let handlers finish within the grace, stop the rest, and
    release a run only once its handler (and a command's whole process group) is gone;
    then wait for every result to be written. False if some could not be. The runs of
    Python handlers that ignored the cancel go into ``at_exit``: they run until the
    process ends, so they are released at its very end (release_at_exit)."""
    life = worker.life
    finished_before = life.finished_total
    metrics.draining.set(1)
    running = worker.busy
    notifier.stopping(f"draining: {running} running, grace {grace:g}s")
    log.info(
        "draining",
        running=running,
        grace_seconds=grace,
        message=f"waiting up to {grace:g}s for {running} running run(s); "
        "a second SIGTERM or SIGINT stops them at once",
    )
    if not worker.stop_claiming(DISPATCHER_JOIN_SECONDS):
        log.warning("dispatcher_still_claiming")  # its claims are refused and released
    released = worker.release_unstarted() + worker.released_after_close
    if not life.wait_idle(grace, interrupt=force):
        stopping = life.interrupt()
        log.warning(
            "stopping_handlers",
            handlers=stopping,
            forced=force.is_set(),
            kill_timeout_seconds=handlers.COMMAND_STOP_TIMEOUT_SECONDS,
        )
        # Python handlers that watch ctx.cancelled return now; one that does not dies
        # with this process. A command may take the whole kill timeout to be gone, and
        # its run is released only after that.
        life.wait_idle(POST_CANCEL_WAIT_SECONDS)
        if not life.wait_idle(handlers.COMMAND_STOP_TIMEOUT_SECONDS, commands_only=True):
            log.error("commands_still_running", handlers=worker.busy)
    report = life.leftovers()
    released += worker.giveback.release(report.release)
    # Past their timeouts, their Python handlers still running: failed as the last act too.
    at_exit.extend(report.timed_out)
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


def release_at_exit(worker: Worker, runs: list[Held], store: RunStore) -> int:
    """Just before the process ends (WorkSide.exit_releasing), when Python handlers still
    run (they ignored the cancel, or their timeout): give their runs back, or write the
    timeout's failure, due ``EXIT_HOLD_SECONDS`` from now at the soonest, so that no other
    daemon starts a run while its first copy still runs here (docs/guarantees.md). Released
    (or failed) any earlier, they ran beside their next claim for as long as this process
    took to end (issue 43). Returns how many were given back."""
    timed_out = [h for h in runs if h.state is State.FINISHING]
    rest = [h for h in runs if h.state is not State.FINISHING]
    returned = [h for h in rest if h.returned is not None]
    running = [h for h in rest if h.returned is None]
    succeeded = worker.giveback.succeed_at_exit(returned, store, lock_wait_ms=EXIT_LOCK_WAIT_MS)
    failed = worker.giveback.fail_at_exit(
        timed_out, store, hold_seconds=EXIT_HOLD_SECONDS, lock_wait_ms=EXIT_LOCK_WAIT_MS
    )
    released = sum(
        worker.giveback.release(
            [held], store, hold_seconds=EXIT_HOLD_SECONDS, lock_wait_ms=EXIT_LOCK_WAIT_MS
        )
        for held in running
    )
    log.info(
        "released_at_exit",
        released=released,
        runs=sorted(h.id for h in running),
        failed_timed_out=failed,
        succeeded_late=succeeded,
        timed_out=sorted(h.id for h in timed_out),
        due_in_seconds=EXIT_HOLD_SECONDS,
        reason="their Python handlers ignored the cancel or their timeout and end with this "
        "process",
    )
    return released


def exit_now(code: int) -> NoReturn:
    """End the process at once (its handler threads with it), the logs flushed first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
