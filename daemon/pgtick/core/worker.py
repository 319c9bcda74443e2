"""The worker pool: a dispatcher that claims in batches, N threads that run handlers, and a
completer that records results in batches.

Claims are bounded by the threads (plus ``worker.prefetch``) less what the lifecycle says is
held for them, running or waiting, so a run is never held without a thread about to start
it. Each thread takes one run at a time from the shared queue and hands its result to the
completer as soon as the handler returns: no run waits behind another's handler, and no
result waits for another run. The completer (completer.py) writes results in batches, each
guarded by its claim (worker id and attempt). Which result may be written,
and when a run stops being held, is the lifecycle's decision (lifecycle.py). No transaction
is open while a handler runs, unless the handler opens one with ``ctx.transaction()``.

``Worker`` stays one class (some 330 lines): the dispatcher, the handler threads and the
drain share one queue of runs to start, one condition and one capacity count, and each
claim's size is computed from all three; split, that count would be read from state another
class owns. Around it: what the claims ask for (``controls.ClaimTypes``), what their answers
tell the next claims (``answers.ClaimAnswers``), and the runs given back without a handler's
result (``giveback.Giveback``).
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime

import structlog

from pgtick.config import JobTypeConfig, WorkerConfig
from pgtick.core import handlers
from pgtick.core.answers import ClaimAnswers
from pgtick.core.completer import Completer
from pgtick.core.controls import ClaimTypes
from pgtick.core.giveback import Giveback
from pgtick.core.handlers import JobType
from pgtick.core.keyset import ClaimBounds
from pgtick.core.lifecycle import Held, Lifecycle
from pgtick.core.outcome import Outcome
from pgtick.core.output import Flusher
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.observability.tracing import Attempt, Tracing
from pgtick.storage.db import retry_delay
from pgtick.storage.store import ClaimedRun, ClaimType, RunStore

# Claim ahead only as many runs as the threads would start within this long, judged by how
# long recent handlers took: a backlog of no-op runs is claimed up to worker.prefetch ahead,
# runs that take seconds are not claimed ahead at all (other daemons may take them).
PREFETCH_HORIZON_SECONDS = 0.05
DURATION_SMOOTHING = 0.05  # weight of the newest handler duration in the running average
MIN_IDLE_WAIT_SECONDS = 0.02
BACKLOG_WAIT_SECONDS = 0.005
# After a claim of its share came back full, a worker process waits this long (or until
# woken) for another process to claim its own share (the supervisor wakes one at once).
TURN_SECONDS = 0.05

log = structlog.get_logger("pgtick.worker")


def claim_type(config: JobTypeConfig, lease_seconds: float) -> ClaimType:
    """What a claim tells the database of a job type: its lease, attempts and limits."""
    return ClaimType(
        config.name,
        lease_seconds,
        config.max_attempts,
        max_running=config.max_running,
        key_path=config.concurrency_key,
        max_running_per_key=config.max_running_per_key,
        rate=config.rate,
        rate_per_key=config.rate_per_key,
    )


def prefetch_ahead(cfg: WorkerConfig, life: Lifecycle, avg: float | None) -> int:
    """How many runs to hold ahead of free threads now that there is a backlog: up to
    ``worker.prefetch``, fewer the longer recent handlers took (``avg``, seconds), none before
    any finished."""
    if avg is None or cfg.prefetch == 0:
        return 0
    if life.active >= cfg.threads:
        # Every thread is busy: none frees up sooner than the youngest handler has run
        # already, so a handler that blocks stops the claiming ahead.
        avg = max(avg, life.since_last_start())
    startable = cfg.threads * PREFETCH_HORIZON_SECONDS / max(avg, 1e-6)
    return min(cfg.prefetch, int(startable))


def fair_share(capacity: int, processes: int) -> int:
    """What one of ``processes`` worker processes claims out of idle with ``capacity``
    free: its share, so that 8 CPU-bound runs go 4 and 4 to two processes (one interpreter
    runs one at a time), not all 8 to the first one woken."""
    return max(1, -(-capacity // processes))


def run_handler(held: Held, tracing: Tracing) -> tuple[Outcome, Attempt, float]:
    """Run a started run's handler (its payload parsed here, in the thread that runs it):
    the outcome, the attempt's span, the handler's duration. A payload Python cannot read
    (the database took it) fails its run."""
    run = held.run
    attempt = tracing.attempt(
        run.job_type, run.id, run.attempt, run.max_attempts, run.traceparent, run.started_at
    )
    try:
        payload = run.payload
    except (ValueError, RecursionError) as exc:
        outcome = handlers.unreadable_payload(held.ctx, exc)
    else:
        outcome = handlers.execute(held.ctx, held.job_type, payload, attempt)
    return outcome, attempt, time.monotonic() - (held.started_at or time.monotonic())


class Worker:
    """Claims due runs for the job types this daemon handles and runs them on a thread pool.

    What happens to each run held is decided by ``self.life`` (the lifecycle); this class
    moves runs between the database, the queue of runs to start and the handler threads.
    """

    def __init__(
        self,
        store: RunStore,
        worker_id: str,
        cfg: WorkerConfig,
        job_types: Mapping[str, JobType],
        metrics: Metrics,
        *,
        log_each_run: bool = False,
        flusher: Flusher | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._tracing = tracing or Tracing()  # off: runs carry their enqueuer's context
        self._flusher = flusher  # writes what handlers print (None: not kept)
        self.worker_id = worker_id
        self._cfg = cfg
        self._job_types = dict(job_types)
        self._metrics = metrics
        # What the claims ask for: the config's types, less the paused, with the limits
        # operators override (controls.py, read by the dispatcher).
        self.types = ClaimTypes(
            [claim_type(jt.config, jt.lease_seconds) for jt in self._job_types.values()],
            cfg.poll_interval_seconds,
        )
        self.controls = self.types.clock
        self._slots_wanted = True  # the dispatcher waits for a free slot (_claim_loop)
        self.handled = sorted(self._job_types)
        leases = [jt.lease_seconds for jt in self._job_types.values()]
        self.life = Lifecycle(
            metrics, log_each_run=log_each_run, min_lease_seconds=min(leases, default=math.inf)
        )
        self._local: collections.deque[Held] = collections.deque()  # claimed, to start
        # Where each type's claim scan starts (keyset.py); a per-key rate's window says when a
        # bound its claims passed is put back.
        self.bounds = ClaimBounds(self.types.key_windows)
        self.answers = ClaimAnswers(self.bounds, metrics)  # what claims found, for the next
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop_claiming = threading.Event()
        self._closing = False
        self.completer = Completer(
            store, worker_id, self.life, metrics, self.types.limited, self.types.keyed
        )
        self.giveback = Giveback(
            store, worker_id, self.life, self.completer, self.bounds, self.types, metrics
        )
        self._threads: list[threading.Thread] = []
        self._dispatcher: threading.Thread | None = None
        self._completer: threading.Thread | None = None
        self.dispatcher_alive_at = time.monotonic()
        self.claimed_total = 0
        self.released_after_close = 0  # claims that landed after the drain began
        # A claim came back full: more is due than this process takes (service/child.py).
        self.on_backlog: Callable[[], None] = lambda: None
        self.processes = 1  # worker processes of this daemon (service/child.py sets it)
        self._avg_duration: float | None = None  # seconds, recent handlers (None: none yet)

    # -- threads ------------------------------------------------------------------------------

    def start(self) -> list[threading.Thread]:
        """Start the dispatcher, completer and handler threads; returns them all, for the
        supervisor to watch (a handler thread that dies is as fatal as a side loop)."""
        for i in range(self._cfg.threads):
            t = threading.Thread(target=self._work_loop, name=f"pgtick-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="pgtick-dispatcher", daemon=True
        )
        self._completer = threading.Thread(
            target=self.completer.run, name="pgtick-completer", daemon=True
        )
        for t in (self._dispatcher, self._completer):
            t.start()
        return [self._dispatcher, self._completer, *self._threads]

    def wake(self) -> None:
        """Something may be due (NOTIFY, reconnect, a slot freed): claim now."""
        self._wake.set()

    def notified(self) -> None:
        """A NOTIFY about a job type this daemon handles: something is due, claim now."""
        self.answers.notified()
        self._wake.set()

    def due(self, job_type: str, run_at: datetime) -> None:
        """A run due at ``run_at`` was made claimable (a ``!due`` NOTIFY): claim now, from a
        bound no later than it."""
        self.bounds.lower(job_type, run_at)
        self.notified()

    def controls_changed(self) -> None:
        """A ``!controls`` NOTIFY (a job type paused, resumed or limited), or the LISTEN
        connection (re)connected: read the controls before the next claim."""
        self.controls.changed()
        self._wake.set()

    def rescan(self) -> None:
        """Runs were put behind the claim's lower bounds (a ``!rescan`` NOTIFY): claim now,
        scanning every type from the start."""
        self.bounds.rescan()
        self._wake.set()

    @property
    def busy(self) -> int:
        return self.life.active

    # -- claiming -----------------------------------------------------------------------------

    def prefetch_now(self) -> int:
        return prefetch_ahead(self._cfg, self.life, self._avg_duration)

    def _capacity(self, backlog: bool) -> int:
        ahead = self.prefetch_now() if backlog else 0
        return self._cfg.threads + ahead - self.life.occupied()

    def _dispatch_loop(self) -> None:
        """Claim until told to stop, on a pinned connection (re-pinned after errors)."""
        failures = 0
        while not self._stop_claiming.is_set():
            try:
                with self._store.pinned("claim") as store:
                    self._metrics.outage.succeeded("claim")  # a connection again
                    self._claim_loop(store)
            except DatabaseError as exc:
                self.dispatcher_alive_at = time.monotonic()  # retrying is progress
                failures += 1
                self._metrics.db_error("claim")
                if not self._metrics.outage.failed("claim", exc, retry_delay(failures)):
                    log.warning("claim_failed", error=str(exc), retry_in=retry_delay(failures))
                self._stop_claiming.wait(retry_delay(failures))
            else:
                failures = 0

    def _claim_loop(self, store: RunStore) -> None:
        backlog = False
        idle = False  # the last claim found nothing: ask when the next run is due first
        while not self._stop_claiming.is_set():
            self.dispatcher_alive_at = time.monotonic()
            self._read_controls(store)
            # Set before the free slots are counted: a thread that frees one after this wakes
            # us (_work_loop), one that freed it before is counted.
            self._slots_wanted = True
            capacity = self._capacity(backlog)
            ahead = self.prefetch_now()
            # With a backlog of short runs, wait for a real batch of free slots: one claim
            # per freed thread would make every run pay a round trip of its own. Long runs
            # are claimed as soon as a thread is free.
            min_batch = max(1, (self._cfg.threads + ahead) // 2) if ahead else 1
            if capacity <= 0 or (backlog and capacity < min_batch):
                self._wake.wait(
                    BACKLOG_WAIT_SECONDS if backlog else self._cfg.poll_interval_seconds
                )
                self._wake.clear()
                continue
            self._slots_wanted = False
            self._wake.clear()
            if not self.life.may_claim():
                # A lease held may have expired while the heartbeat could not renew it: no
                # claim until a beat has re-checked them, or this daemon could claim again a
                # run its own handler still runs or its writer still holds. The heartbeat
                # wakes us.
                self._wake.wait(self._cfg.poll_interval_seconds)
                continue
            if idle and not self.bounds.look_due():
                # Idle: one cheap probe per poll, and a claim only when something is due
                # (a NOTIFY wakes us and claims at once) or a look back is (keyset.py).
                due_in = store.next_due_in(self.types.claimable, self.bounds.probe_lows())
                if due_in is not None and due_in <= 0 and self.answers.held_back:
                    self.answers.held_back = False
                    idle = not self._wake.wait(
                        self.types.held_back_wait(
                            store, self.answers.empty_claims, self._cfg.poll_interval_seconds
                        )
                    )
                    continue
                if due_in is None or due_in > 0:
                    wait = self._cfg.poll_interval_seconds
                    if due_in is not None:
                        wait = max(MIN_IDLE_WAIT_SECONDS, min(wait, due_in))
                    rescan_in = self.bounds.pending()
                    if rescan_in is not None:
                        wait = max(MIN_IDLE_WAIT_SECONDS, min(wait, rescan_in))
                    idle = not self._wake.wait(wait)
                    continue
            sent_at, notified = time.monotonic(), self.answers.sending()
            lows, looks = self.bounds.for_claim()
            # Out of idle, a worker process takes its share of the free threads and passes
            # the turn (below): a burst is split over the processes, not run by the first.
            limit = capacity if backlog else fair_share(capacity, self.processes)
            runs, behind = store.claim_looking(self.worker_id, self.types.types, limit, lows, looks)
            self.answers.claimed(runs, behind, sent_at, notified)
            if runs:
                self._accept(store, runs, sent_at, full=len(runs) == limit)
            backlog = len(runs) == limit
            idle = not runs and not behind
            if backlog and limit < capacity:
                # Its share came back full: the supervisor wakes another process (on_backlog),
                # which claims its share before this one claims again (or a wake-up comes).
                self._wake.wait(TURN_SECONDS)

    def _read_controls(self, store: RunStore) -> None:
        """Read the runtime controls and claim by them from now on; give back the runs of a
        type paused now that no thread has started (paused: not started, whoever holds it).
        Only when they may have changed (controls.py): otherwise this costs nothing."""
        if not self.controls.due():
            return
        controls = self.controls.read(store.job_type_controls)
        before = self.types.paused
        newly = self.types.apply(controls)
        if self.types.paused != before:
            log.info("job_types_paused", paused=sorted(self.types.paused))
        self._metrics.paused(self.handled, self.types.paused)
        self.completer.limits_changed(self.types.limited, self.types.keyed)
        self.bounds.set_key_windows(self.types.key_windows)
        if newly:
            unstarted = [h for h in self.life.unstarted() if h.run.job_type in newly]
            if unstarted:
                self.giveback.release(unstarted, store)

    def _accept(
        self, store: RunStore, runs: list[ClaimedRun], sent_at: float, *, full: bool = False
    ) -> None:
        fresh = [
            Held(
                run,
                handlers.claimed_context(
                    run, self._store, self.worker_id, self.life, self._flusher
                ),
                self._job_types[run.job_type],
            )
            for run in runs
        ]
        refused = self.life.accept(fresh, sent_at)
        if refused:  # the drain began while this claim was in flight: give them back now
            released = store.release(self.worker_id, [(h.id, h.run.attempt) for h in refused])
            self.released_after_close += len(released)
            log.info("claim_released_on_shutdown", runs=len(refused), released=len(released))
            return
        with self._cond:
            self._local.extend(fresh)
            self._cond.notify(len(fresh))
        self.claimed_total += len(fresh)
        if full:
            self.on_backlog()  # a worker process: the supervisor wakes another one

    # -- running ------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        """Run claimed runs one at a time: the next waits in the shared queue, where any idle
        thread can take it, and each result goes to the writer as soon as it is known.
        Nothing else here catches: ``handlers.execute`` never raises, so an exception is a
        bug, and the thread dies for the supervisor to see."""
        while True:
            held = self._next()
            if held is None:
                return
            if not self.life.start(held):
                continue  # released, lost or cancelled before a thread got to it
            outcome, attempt, duration = run_handler(held, self._tracing)
            avg = self._avg_duration  # threads race here; any recent value will do
            self._avg_duration = (
                duration if avg is None else avg + DURATION_SMOOTHING * (duration - avg)
            )
            to_write = self.life.finish(held, outcome, duration)
            if to_write is not None:
                self.completer.submit(held, to_write, duration)
            # The attempt's outcome: the handler's, or the timeout's failure written instead.
            ended = to_write if to_write is not None and to_write.kind != "cancelled" else outcome
            attempt.end(ended.kind, ended.error, ended.error_type, ended.detail)
            if not self._local and (
                self._slots_wanted
                or held.run.job_type in self.types.limited
                or held.run.job_type in self.types.keyed
            ):
                # Nothing left to take: claim more now, if the dispatcher waits for a free
                # slot or this run's end frees a limit's. Otherwise its last claim took
                # what was due (the one after it found nothing, or will): a claim now would
                # find nothing either, one more round trip per run at a light load (a
                # NOTIFY or the idle probe brings the next). With runs still queued, this
                # thread takes the next one, and a backlog's claims top the queue up.
                self._wake.set()

    def _next(self) -> Held | None:
        """The next claimed run to start, waiting for one; None once closing and none is
        left. The queue's own operations are atomic: the lock is taken only to wait."""
        while True:
            try:
                return self._local.popleft()
            except IndexError:
                pass
            with self._cond:
                while not self._local and not self._closing:
                    self._cond.wait()
                if not self._local:
                    return None

    # -- shutdown -------------------------------------------------------------------------------

    def stop_claiming(self, timeout: float) -> bool:
        """Stop the dispatcher and wait for it, so no claim is in flight when the drain
        releases what was claimed; later claims are refused by the lifecycle anyway."""
        self._stop_claiming.set()
        self._wake.set()
        self.life.close()  # from now on nothing is accepted or started
        if self._dispatcher is not None:
            self._dispatcher.join(timeout)
        return self._dispatcher is None or not self._dispatcher.is_alive()

    def release_unstarted(self) -> int:
        """Give back claimed runs no thread has started."""
        unstarted = self.life.unstarted()
        with self._cond:
            self._local.clear()
        return self.giveback.release(unstarted)

    def close(self) -> None:
        """Let idle handler threads exit, and the completer once it has written everything."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self.completer.close()

    def wait_written(self, timeout: float) -> list[int]:
        """After ``close``: wait up to ``timeout`` for the completer to write what it holds;
        returns the run ids it could not write (the database is unreachable)."""
        if self._completer is not None:
            self._completer.join(timeout)
        return self.completer.unwritten()
