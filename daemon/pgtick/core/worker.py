"""The worker pool: a dispatcher that claims in batches, N threads that run handlers, and a
completer that records results in batches.

Claims are bounded by free threads (plus ``worker.prefetch``), so a run is never held without
a thread about to start it. Results go through one completer thread that writes up to
``COMPLETE_BATCH_MAX`` results per transaction, guarded by ``locked_by``. Which result may be
written, and when a run stops being held, is the lifecycle's decision (lifecycle.py). No
transaction is open while a handler runs, unless the handler opens one with
``ctx.transaction()``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping

import structlog

from pgtick.config import WorkerConfig
from pgtick.core import handlers
from pgtick.core.handlers import JobType, Outcome
from pgtick.core.lifecycle import Held, Lifecycle
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage.db import retry_delay
from pgtick.storage.store import ClaimedRun, ClaimType, Failure, RunStore

COMPLETE_BATCH_MAX = 500
# Claim ahead only as many runs as the threads would start within this long, judged by how
# long recent handlers took: a backlog of no-op runs is claimed up to worker.prefetch ahead,
# runs that take seconds are not claimed ahead at all (other daemons may take them).
PREFETCH_HORIZON_SECONDS = 0.05
DURATION_SMOOTHING = 0.05  # weight of the newest handler duration in the running average
WORKER_BATCH_MAX = 16  # runs one handler thread takes from the queue at once, with a backlog
COMPLETE_BATCH_WINDOW_SECONDS = 0.002
MIN_IDLE_WAIT_SECONDS = 0.02
BACKLOG_WAIT_SECONDS = 0.005

log = structlog.get_logger("pgtick.worker")


class Completer:
    """Writes outcomes in batches: one transaction per batch, guarded by ``locked_by``."""

    def __init__(self, store: RunStore, worker_id: str, life: Lifecycle, metrics: Metrics) -> None:
        self._store = store
        self._worker_id = worker_id
        self._life = life
        self._metrics = metrics
        self._items: collections.deque[tuple[Held, Outcome, float]] = collections.deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closing = False

    def submit(self, held: Held, outcome: Outcome, duration: float) -> None:
        self.submit_many([(held, outcome, duration)])

    def submit_many(self, results: list[tuple[Held, Outcome, float]]) -> None:
        with self._cond:
            was_empty = not self._items
            self._items.extend(results)
            if was_empty or len(self._items) >= COMPLETE_BATCH_MAX:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._items or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def run(self) -> None:
        """Write outcomes until closed, on a pinned connection (re-pinned after errors)."""
        failures = 0
        while True:
            try:
                with self._store.pinned("complete") as store:
                    if self._loop(store):
                        return
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("complete")
                log.warning("complete_failed", error=str(exc), retry_in=retry_delay(failures))
                with self._cond:
                    closing = self._closing
                if closing and failures > 3:
                    return
                time.sleep(retry_delay(failures))

    def _loop(self, store: RunStore) -> bool:
        """Write batches until closed (True) or until the database fails (raises)."""
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    self._cond.wait()
                if not self._items and self._closing:
                    return True
            # Let a batch gather for a moment when it is small.
            if len(self._items) < COMPLETE_BATCH_MAX:
                time.sleep(COMPLETE_BATCH_WINDOW_SECONDS)
            with self._cond:
                n = min(len(self._items), COMPLETE_BATCH_MAX)
                batch = [self._items.popleft() for _ in range(n)]
                self._in_flight = len(batch)
            try:
                self._write(store, batch)
            except DatabaseError:
                with self._cond:  # nothing was written: the batch is retried as it is
                    self._items.extendleft(reversed(batch))
                    self._in_flight = 0
                raise
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()

    def _write(self, store: RunStore, batch: list[tuple[Held, Outcome, float]]) -> None:
        succeed = [h.id for h, o, _ in batch if o.kind == "succeeded"]
        failures = [
            Failure(h.id, o.error, o.error_type, o.detail, o.retry_in_seconds)
            for h, o, _ in batch
            if o.kind in ("failed", "dead")
        ]
        succeeded, failed = store.finish(self._worker_id, succeed, failures)
        self._life.written(batch, succeeded, {r.id: r for r in failed})


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
    ) -> None:
        self._store = store
        self.worker_id = worker_id
        self._cfg = cfg
        self._job_types = dict(job_types)
        self._metrics = metrics
        self._claim_types = [
            ClaimType(jt.name, jt.lease_seconds, jt.config.max_attempts)
            for jt in self._job_types.values()
        ]
        self.handled = sorted(self._job_types)
        self.life = Lifecycle(metrics, log_each_run=log_each_run)
        self._local: collections.deque[Held] = collections.deque()  # claimed, to start
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop_claiming = threading.Event()
        self._closing = False
        self.completer = Completer(store, worker_id, self.life, metrics)
        self._threads: list[threading.Thread] = []
        self._dispatcher: threading.Thread | None = None
        self.dispatcher_alive_at = time.monotonic()
        self.claimed_total = 0
        self.released_after_close = 0  # claims that landed after the drain began
        self._avg_duration: float | None = None  # seconds, recent handlers (None: none yet)
        # Cleared by the heartbeat while it cannot reach the database: leases held meanwhile
        # may have expired and been reaped, so no claim until a beat has re-checked them
        # (otherwise this daemon could claim again a run its own handler still runs).
        self.leases_confirmed = threading.Event()
        self.leases_confirmed.set()

    # -- threads ------------------------------------------------------------------------------

    def start(self) -> list[threading.Thread]:
        """Start the dispatcher, completer and handler threads; returns the side loops."""
        for i in range(self._cfg.threads):
            t = threading.Thread(target=self._work_loop, name=f"pgtick-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="pgtick-dispatcher", daemon=True
        )
        loops = [
            self._dispatcher,
            threading.Thread(target=self.completer.run, name="pgtick-completer", daemon=True),
        ]
        for t in loops:
            t.start()
        return loops

    def wake(self) -> None:
        """Something may be due (NOTIFY, reconnect, a slot freed): claim now."""
        self._wake.set()

    @property
    def busy(self) -> int:
        return self.life.active

    # -- claiming -----------------------------------------------------------------------------

    def prefetch_now(self) -> int:
        """How many runs to hold ahead of free threads now that there is a backlog: up to
        ``worker.prefetch``, fewer the longer recent handlers took, none before any finished."""
        avg = self._avg_duration
        if avg is None or self._cfg.prefetch == 0:
            return 0
        startable = self._cfg.threads * PREFETCH_HORIZON_SECONDS / max(avg, 1e-6)
        return min(self._cfg.prefetch, int(startable))

    def _capacity(self, backlog: bool) -> int:
        ahead = self.prefetch_now() if backlog else 0
        with self._cond:
            return self._cfg.threads + ahead - self.life.active - len(self._local)

    def _dispatch_loop(self) -> None:
        """Claim until told to stop, on a pinned connection (re-pinned after errors)."""
        failures = 0
        while not self._stop_claiming.is_set():
            try:
                with self._store.pinned("claim") as store:
                    self._claim_loop(store)
            except DatabaseError as exc:
                self.dispatcher_alive_at = time.monotonic()  # retrying is progress
                failures += 1
                self._metrics.db_error("claim")
                log.warning("claim_failed", error=str(exc), retry_in=retry_delay(failures))
                self._stop_claiming.wait(retry_delay(failures))
            else:
                failures = 0

    def _claim_loop(self, store: RunStore) -> None:
        backlog = False
        idle = False  # the last claim found nothing: ask when the next run is due first
        while not self._stop_claiming.is_set():
            self.dispatcher_alive_at = time.monotonic()
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
            self._wake.clear()
            if not self.leases_confirmed.is_set() and self.life.held_count():
                self.leases_confirmed.wait(self._cfg.poll_interval_seconds)
                continue
            if idle:
                # Idle: one cheap probe per poll, and a claim only when something is due
                # (a NOTIFY wakes us and claims at once).
                due_in = store.next_due_in(self.handled)
                if due_in is None or due_in > 0:
                    wait = self._cfg.poll_interval_seconds
                    if due_in is not None:
                        wait = max(MIN_IDLE_WAIT_SECONDS, min(wait, due_in))
                    idle = not self._wake.wait(wait)
                    continue
            runs = store.claim(self.worker_id, self._claim_types, capacity)
            if runs:
                self._accept(store, runs)
            backlog = len(runs) == capacity
            idle = not runs

    def _accept(self, store: RunStore, runs: list[ClaimedRun]) -> None:
        fresh = [
            Held(
                run,
                handlers.claimed_context(run, self._store, self.worker_id, self.life),
                self._job_types[run.job_type],
            )
            for run in runs
        ]
        refused = self.life.accept(fresh)
        if refused:  # the drain began while this claim was in flight: give them back now
            released = store.release(self.worker_id, [h.id for h in refused])
            self.released_after_close += len(released)
            log.info("claim_released_on_shutdown", runs=len(refused), released=len(released))
            return
        with self._cond:
            self._local.extend(fresh)
            self._cond.notify(len(fresh))
        self.claimed_total += len(fresh)

    # -- running ------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        threads = self._cfg.threads
        while True:
            with self._cond:
                while not self._local and not self._closing:
                    self._cond.wait()
                if not self._local:
                    return
                # With a backlog each thread takes a small share at once: fewer hand-offs
                # under the lock than one run per wake-up.
                take = max(1, min(WORKER_BATCH_MAX, len(self._local) // threads))
                batch = [self._local.popleft() for _ in range(take)]
            results = []
            while batch:
                held = batch.pop(0)
                if not self.life.start(held):
                    continue  # released or lost before a thread got to it
                outcome = handlers.execute(held.ctx, held.job_type, held.run.payload)
                duration = time.monotonic() - (held.started_at or time.monotonic())
                avg = self._avg_duration  # threads race here; any recent value will do
                self._avg_duration = (
                    duration if avg is None else avg + DURATION_SMOOTHING * (duration - avg)
                )
                to_write = self.life.finish(held, outcome, duration)
                if to_write is not None:
                    results.append((held, to_write, duration))
                if batch and duration > PREFETCH_HORIZON_SECONDS:
                    # Not a short run after all: the rest go back for idle threads.
                    with self._cond:
                        self._local.extendleft(reversed(batch))
                        self._cond.notify(len(batch))
                    batch = []
            if results:
                self.completer.submit_many(results)
            self._wake.set()

    # -- for the heartbeat --------------------------------------------------------------------

    def expire_timeouts(self) -> float | None:
        """Fail Python runs past their timeout; returns the next deadline (monotonic)."""
        expired, next_deadline = self.life.expire()
        for held, outcome, duration in expired:
            log.warning("run_timed_out", run_id=held.id, job_type=held.run.job_type)
            self.completer.submit(held, outcome, duration)
        return next_deadline

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
        return self.release(unstarted)

    def release(self, runs: list[Held]) -> int:
        """Give runs back to the queue (attempt not counted); returns how many were."""
        if not runs:
            return 0
        released: set[int] = set()
        try:
            released = self._store.release(self.worker_id, [h.id for h in runs])
        except DatabaseError as exc:
            self._metrics.db_error("release")
            log.error("release_failed", error=str(exc), runs=len(runs))
        self.life.released(runs, released)
        return len(released)

    def close(self) -> None:
        """Let idle handler threads exit."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self.completer.close()
