"""The worker pool: a dispatcher that claims in batches, N threads that run handlers, and a
completer that records results in batches.

Claims are bounded by free threads (plus ``worker.prefetch``), so a run is never held without
a thread about to start it. Results go through one completer thread that finishes up to
``COMPLETE_BATCH_MAX`` runs per statement, guarded by ``locked_by``; a run stays in ``held``
(and keeps being heartbeated) until its result is written. No transaction is open while a
handler runs (SPEC §2 rule 7).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from pgtick import handlers
from pgtick.config import WorkerConfig
from pgtick.db import retry_delay
from pgtick.errors import DatabaseError
from pgtick.handlers import JobContext, JobType, Outcome
from pgtick.metrics import Metrics
from pgtick.store import ClaimedRun, ClaimType, Failure, RunStore

COMPLETE_BATCH_MAX = 500
COMPLETE_BATCH_WINDOW_SECONDS = 0.002
MIN_IDLE_WAIT_SECONDS = 0.02
BACKLOG_WAIT_SECONDS = 0.005

log = structlog.get_logger("pgtick.worker")


@dataclass(eq=False)
class Held:
    """A run this daemon holds a lease on, from claim until its result is written."""

    run: ClaimedRun
    ctx: JobContext
    job_type: JobType
    started_at: float | None = None  # monotonic, when a thread picked it up
    deadline: float | None = None  # monotonic, Python handlers with a timeout
    finishing: bool = False  # an outcome is on its way to the database
    abandoned: bool = False  # timed out: the handler's eventual result is ignored


class Completer:
    """Writes outcomes in batches: one statement per kind per batch."""

    def __init__(self, store: RunStore, worker_id: str, metrics: Metrics) -> None:
        self._store = store
        self._worker_id = worker_id
        self._metrics = metrics
        self._items: collections.deque[tuple[Held, Outcome, float | None]] = collections.deque()
        self._cond = threading.Condition()
        self._in_flight = 0
        self._closing = False
        self.forget: collections.abc.Callable[[list[Held]], None] = lambda held: None

    def submit(self, held: Held, outcome: Outcome, duration: float | None) -> None:
        with self._cond:
            self._items.append((held, outcome, duration))
            if len(self._items) == 1 or len(self._items) >= COMPLETE_BATCH_MAX:
                self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._items) + self._in_flight

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
                batch = [self._items.popleft() for _ in range(min(len(self._items), 500))]
                self._in_flight = len(batch)
            try:
                self._write(store, batch)
            except DatabaseError:
                with self._cond:  # keep the batch: it is written after reconnecting
                    self._items.extendleft(reversed(batch))
                    self._in_flight = 0
                raise
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()

    def _write(self, store: RunStore, batch: list[tuple[Held, Outcome, float | None]]) -> None:
        succeed = [h for h, o, _ in batch if o.kind == "succeeded"]
        fail = [(h, o) for h, o, _ in batch if o.kind in ("failed", "dead")]
        written: set[int] = set()
        if succeed:
            written |= store.succeed(self._worker_id, [h.run.id for h in succeed])
        if fail:
            failures = [
                Failure(h.run.id, o.error, o.error_type, o.detail, o.retry_in_seconds)
                for h, o in fail
            ]
            written |= {r.id for r in store.fail(self._worker_id, failures)}
        done = []
        for held, outcome, duration in batch:
            job_type = held.run.job_type
            if outcome.kind == "committed":
                self._metrics.attempt_finished(job_type, "succeeded", duration)
                done.append(held)
            elif outcome.kind in ("succeeded", "failed", "dead"):
                if held.run.id in written:
                    label = "succeeded" if outcome.kind == "succeeded" else "failed"
                    self._metrics.attempt_finished(job_type, label, duration)
                else:
                    # The lease was gone: another worker owns the run now.
                    self._metrics.lease_lost(job_type)
                    self._metrics.attempt_finished(job_type, "lost", duration)
                    log.warning("lease_lost", run_id=held.run.id, job_type=job_type, at="finish")
                done.append(held)
            elif held.ctx.lost:
                self._metrics.attempt_finished(job_type, "lost", duration)
                done.append(held)
            # else "interrupted" by the shutdown: left held, the drain releases it.
        self.forget(done)


class Worker:
    """Claims due runs for the job types this daemon handles and runs them on a thread pool."""

    def __init__(
        self,
        store: RunStore,
        worker_id: str,
        cfg: WorkerConfig,
        job_types: Mapping[str, JobType],
        metrics: Metrics,
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
        self._held: dict[int, Held] = {}
        self._local: collections.deque[Held] = collections.deque()
        self._cond = threading.Condition()
        self._busy = 0
        self._wake = threading.Event()
        self._stop_claiming = threading.Event()
        self._closing = False
        self._interrupted = False
        self.completer = Completer(store, worker_id, metrics)
        self.completer.forget = self._forget
        self._threads: list[threading.Thread] = []
        self.dispatcher_alive_at = time.monotonic()
        self.claimed_total = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> list[threading.Thread]:
        """Start the dispatcher, completer and handler threads; returns the side loops."""
        for i in range(self._cfg.threads):
            t = threading.Thread(target=self._work_loop, name=f"pgtick-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        loops = [
            threading.Thread(target=self._dispatch_loop, name="pgtick-dispatcher", daemon=True),
            threading.Thread(target=self.completer.run, name="pgtick-completer", daemon=True),
        ]
        for t in loops:
            t.start()
        return loops

    def wake(self) -> None:
        """Something may be due (NOTIFY, reconnect, a slot freed): claim now."""
        self._wake.set()

    def stop_claiming(self) -> None:
        self._stop_claiming.set()
        self._wake.set()

    @property
    def busy(self) -> int:
        return self._busy

    # -- claiming -----------------------------------------------------------------------------

    def _capacity(self) -> int:
        with self._cond:
            return self._cfg.threads + self._cfg.prefetch - self._busy - len(self._local)

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
        min_batch = max(1, (self._cfg.threads + self._cfg.prefetch) // 2)
        while not self._stop_claiming.is_set():
            self.dispatcher_alive_at = time.monotonic()
            capacity = self._capacity()
            # With a backlog, wait for a real batch of free threads: one claim per freed
            # thread would make every run pay a round trip of its own.
            if capacity <= 0 or (backlog and capacity < min_batch):
                self._wake.wait(
                    BACKLOG_WAIT_SECONDS if backlog else self._cfg.poll_interval_seconds
                )
                self._wake.clear()
                backlog = backlog and self._capacity() < min_batch
                continue
            self._wake.clear()
            runs = store.claim(self.worker_id, self._claim_types, capacity)
            if runs:
                self._accept(runs)
            backlog = len(runs) == capacity
            if backlog:
                continue
            due_in = store.next_due_in(self.handled)
            wait = self._cfg.poll_interval_seconds
            if due_in is not None:
                wait = max(MIN_IDLE_WAIT_SECONDS, min(wait, due_in))
            self._wake.wait(wait)

    def _accept(self, runs: list[ClaimedRun]) -> None:
        fresh = []
        for run in runs:
            ctx = handlers.claimed_context(run, self._store, self.worker_id)
            fresh.append(Held(run, ctx, self._job_types[run.job_type]))
            self._metrics.run_started(run.job_type, (run.started_at - run.run_at).total_seconds())
        with self._cond:
            for held in fresh:
                self._held[held.run.id] = held
            self._local.extend(fresh)
            self._cond.notify(len(fresh))
        self.claimed_total += len(fresh)

    # -- running ------------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            with self._cond:
                while not self._local and not self._closing:
                    self._cond.wait()
                if not self._local:
                    return
                held = self._local.popleft()
                self._busy += 1
                self._metrics.busy_threads.set(self._busy)
                held.started_at = time.monotonic()
                timeout = held.job_type.config.timeout_seconds
                if timeout is not None and held.job_type.fn is not None:
                    held.deadline = held.started_at + timeout
            outcome = handlers.execute(held.ctx, held.job_type, held.run.payload)
            duration = time.monotonic() - held.started_at
            with self._cond:
                self._busy -= 1
                self._metrics.busy_threads.set(self._busy)
                submit = not held.abandoned and not held.finishing
                if submit:
                    held.finishing = True
            if submit:
                if held.ctx.lost and outcome.kind != "committed":
                    outcome = Outcome(held.run.id, "lost")
                elif self._interrupted and outcome.kind in ("failed", "dead", "lost"):
                    # Stopped by the shutdown, not by its own fault: released, not counted.
                    outcome = Outcome(held.run.id, "interrupted")
                self.completer.submit(held, outcome, duration)
            self._wake.set()

    def _forget(self, done: list[Held]) -> None:
        # No notify: idle handler threads wait on this condition, and waking them all for
        # every batch of results costs more than the work itself (wait_idle polls).
        with self._cond:
            for held in done:
                if self._held.get(held.run.id) is held:
                    del self._held[held.run.id]

    # -- for the heartbeat --------------------------------------------------------------------

    def leases(self) -> dict[int, float]:
        """{run id: lease seconds} of everything held, for one heartbeat statement."""
        with self._cond:
            return {rid: h.job_type.lease_seconds for rid, h in self._held.items()}

    def lost(self, run_ids: set[int]) -> None:
        """The heartbeat found these leases gone: stop their handlers, drop their results."""
        with self._cond:
            gone = []
            for rid in run_ids:
                held = self._held.get(rid)
                if held is None or held.finishing:
                    continue  # finished meanwhile; the completer's guarded write decides
                held.ctx.lost = True
                held.ctx.cancelled.set()
                del self._held[rid]
                if held in self._local:
                    self._local.remove(held)
                gone.append(held)
        for held in gone:
            self._metrics.lease_lost(held.run.job_type)
            log.warning("lease_lost", run_id=held.run.id, job_type=held.run.job_type)

    def expire_timeouts(self) -> float | None:
        """Fail Python runs past their timeout; returns the next deadline (monotonic)."""
        now = time.monotonic()
        expired: list[Held] = []
        next_deadline: float | None = None
        with self._cond:
            for held in self._held.values():
                if held.deadline is None or held.finishing:
                    continue
                if held.deadline <= now:
                    held.finishing = held.abandoned = True
                    expired.append(held)
                elif next_deadline is None or held.deadline < next_deadline:
                    next_deadline = held.deadline
        for held in expired:
            held.ctx.cancelled.set()
            jt, ctx = held.job_type, held.ctx
            message = f"timed out after {jt.config.timeout_seconds:g}s"
            outcome = handlers.failed(ctx, jt, message, "timeout", message)
            log.warning("run_timed_out", run_id=ctx.run_id, job_type=ctx.job_type)
            self.completer.submit(held, outcome, now - (held.started_at or now))
        return next_deadline

    # -- shutdown -------------------------------------------------------------------------------

    def release_unstarted(self) -> int:
        """Give back prefetched runs no thread has started."""
        with self._cond:
            unstarted = list(self._local)
            self._local.clear()
        return self._release(unstarted)

    def wait_idle(self, timeout: float, interrupt: threading.Event | None = None) -> bool:
        """Wait until no handler is running, up to ``timeout`` (or until ``interrupt``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                if self._busy == 0:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (interrupt is not None and interrupt.is_set()):
                    return False
                self._cond.wait(min(left, 0.05))

    def cancel_running(self) -> int:
        """Tell every running handler to stop (commands are killed)."""
        with self._cond:
            self._interrupted = True
            running = [h for h in self._held.values() if h.started_at is not None]
        for held in running:
            held.ctx.cancelled.set()
        return len(running)

    def release_held(self) -> int:
        """Release every run still held once the completer is flushed (end of a drain):
        handlers that did not finish, and commands killed by the shutdown."""
        with self._cond:
            leftover = list(self._held.values())
        return self._release(leftover)

    def _release(self, runs: list[Held]) -> int:
        if not runs:
            return 0
        try:
            released = self._store.release(self.worker_id, [h.run.id for h in runs])
        except DatabaseError as exc:
            self._metrics.db_error("release")
            log.error("release_failed", error=str(exc), runs=len(runs))
            return 0
        for held in runs:
            if held.run.id in released:
                self._metrics.attempt_finished(held.run.job_type, "released", None)
        self._forget(runs)
        return len(released)

    def close(self) -> None:
        """Let idle handler threads exit."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self.completer.close()
