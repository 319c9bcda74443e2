"""Runs the worker gives back or lets go of without a handler's result: released to the queue
(the drain, runs claimed ahead that waited too long for a thread, a type paused), let go of
after an operator's cancel, or failed by a timeout whose handler never returned. Each is
guarded by the claim (worker id and attempt) in the database; the lifecycle says which runs,
and is told how each ended.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from pgtick.core.completer import Completer, Result, announce_freed, limited_among
from pgtick.core.controls import ClaimTypes
from pgtick.core.keyset import ClaimBounds
from pgtick.core.lifecycle import UNSTARTED_MAX_WAIT_SECONDS, Held, Lifecycle, State
from pgtick.core.outcome import Outcome
from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage import db
from pgtick.storage.store import Failure, RunStore

log = structlog.get_logger("pgtick.worker")

# The heartbeat's releases wait this long for a row another session holds locked, then give
# up until its next beat: a release that waited for the lock held up every beat behind it,
# and the leases of the daemon's running runs ended for want of renewal (torture seed 4320).
STALE_LOCK_WAIT_MS = 100


class Giveback:
    """The worker's releases and let-gos, on the store given (the heartbeat's, or its own)."""

    def __init__(
        self,
        store: RunStore,
        worker_id: str,
        life: Lifecycle,
        completer: Completer,
        bounds: ClaimBounds,
        types: ClaimTypes,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._life = life
        self._completer = completer
        self._bounds = bounds
        self._types = types
        self._metrics = metrics

    def let_go(self, given_up: list[Held]) -> None:
        """Hand the writer the runs given up (by the heartbeat) that we must let go of in the
        database: cancelled by an operator before a thread started them."""
        results: list[Result] = [
            (held, Outcome(held.id, "cancelled"), None)
            for held in given_up
            if held.state is State.FINISHING
        ]
        if results:
            self._completer.submit_many(results)

    def release_stale(self, store: RunStore) -> int:
        """Give back claimed runs that have waited for a thread too long (every thread is
        held up by slow handlers): queued again, another daemon, or this one later, starts
        them, instead of this daemon renewing their leases for as long as its threads stay
        busy. Called by the heartbeat, on its own connection."""
        stale = self._life.unstarted(UNSTARTED_MAX_WAIT_SECONDS)
        if not stale:
            return 0
        released = self.release(stale, store, lock_wait_ms=STALE_LOCK_WAIT_MS)
        log.info("unstarted_runs_released", runs=len(stale), released=released)
        return released

    def expire_timeouts(self) -> float | None:
        """Tell Python handlers past their timeout to stop; returns the next deadline
        (monotonic). Their runs stay held until the handlers return (the lifecycle writes
        the failure then); the writer notes on each run that it timed out meanwhile."""
        expired, next_deadline = self._life.expire()
        for held in expired:
            log.warning("run_timed_out", run_id=held.id, job_type=held.run.job_type)
        marks: list[Result] = [
            (held, Outcome(held.id, "timed_out", held.expired.error, "timeout"), None)
            for held in expired
            if held.expired is not None
        ]
        if marks:
            self._completer.submit_many(marks)
        return next_deadline

    def succeed_at_exit(self, runs: list[Held], store: RunStore, lock_wait_ms: int) -> int:
        """The drain's last act for runs set aside for the exit whose handlers then returned
        a success: write it, each on its own, waiting ``lock_wait_ms`` at most for its row's
        lock. Released instead, the run ran again. One not written is left to the reaper;
        returns how many were written."""

        def write(held: Held) -> bool:
            outcome = held.returned
            if outcome is None:
                return False
            results = None if outcome.result is None else {held.id: outcome.result}
            claim = (held.id, held.run.attempt)
            done, _ = store.finish(
                self._worker_id, [claim], [], lock_wait_ms=lock_wait_ms, results=results
            )
            return bool(done)

        return self._write_at_exit(runs, store, write, "success_not_written_at_exit")

    def fail_at_exit(
        self, runs: list[Held], store: RunStore, hold_seconds: float, lock_wait_ms: int
    ) -> int:
        """The drain's last act for runs past their timeout whose Python handlers never
        returned (they die with this process): write the timeout's failure, its retry due
        no sooner than ``hold_seconds`` from now, each on its own and waiting ``lock_wait_ms``
        at most for its row's lock. Written at the drain's end instead, a short backoff let
        another daemon start the retry while the first copy still ran here (torture seed
        4324, run 2997). A run an operator cancelled meanwhile is let go of; one not written
        is left to the reaper. Returns how many failures were written."""

        def write(held: Held) -> bool:
            outcome = held.expired
            if outcome is None:
                return False
            retry = outcome.retry_in_seconds
            failure = Failure(
                held.id,
                held.run.attempt,
                outcome.error,
                outcome.error_type,
                outcome.detail,
                None if retry is None else max(retry, hold_seconds),
            )
            _, failed = store.finish(self._worker_id, [], [failure], lock_wait_ms=lock_wait_ms)
            if not failed:  # the claim guard refused it: cancelled by an operator, or lost
                claim = (held.id, held.run.attempt)
                store.acknowledge_cancel(self._worker_id, [claim], lock_wait_ms=lock_wait_ms)
            return bool(failed)

        return self._write_at_exit(runs, store, write, "timeout_not_written_at_exit")

    def _write_at_exit(
        self, runs: list[Held], store: RunStore, write: Callable[[Held], bool], not_written: str
    ) -> int:
        """``write`` each run's outcome on its own (a statement that fails or meets a lock
        holds up no other run's), log ``not_written`` for one that could not be, then
        announce the slots of limited types this freed; returns how many were written."""
        written: set[int] = set()
        for held in runs:
            try:
                if write(held):
                    written.add(held.id)
            except DatabaseError as exc:
                self._metrics.db_error("complete")
                log.warning(
                    not_written,
                    run_id=held.id,
                    error=str(exc),
                    reason="its lease ends and the reaper decides, after this process ended",
                )
        freed = limited_among(runs, written, self._types.limited)
        if freed:
            try:
                announce_freed(store, freed, self._types.keyed)
            except DatabaseError as exc:
                log.warning("announce_failed", error=str(exc))
        return len(written)

    def release(
        self,
        runs: list[Held],
        store: RunStore | None = None,
        hold_seconds: float = 0.0,
        *,
        lock_wait_ms: int | None = None,
    ) -> int:
        """Give runs back to the queue (attempt not counted), due no sooner than
        ``hold_seconds`` from now, and let go of those an operator cancelled meanwhile;
        returns how many were released. With ``lock_wait_ms``, a row another session holds
        locked longer leaves the runs not given back yet claimed (still ours, their leases
        renewed), for a later release or a thread."""
        if not runs:
            return 0
        store = store or self._store
        claims = [(h.id, h.run.attempt) for h in runs]
        released: set[int] = set()
        let_go: set[int] = set()
        kept: list[Held] = []
        try:
            released = store.release(
                self._worker_id, claims, hold_seconds, lock_wait_ms=lock_wait_ms
            )
            rest = [c for c in claims if c[0] not in released]
            let_go = (
                store.acknowledge_cancel(self._worker_id, rest, lock_wait_ms=lock_wait_ms)
                if rest
                else set()
            )
            # A run given back announces itself (release); one let go of after a cancel
            # frees its slot as a finished run does, and is announced the same way.
            freed = limited_among(runs, let_go, self._types.limited)
            if freed:
                announce_freed(store, freed, self._types.keyed)
        except DatabaseError as exc:
            self._metrics.db_error("release")
            if lock_wait_ms is not None and db.lock_not_available(exc):
                # The statement that waited failed whole: nothing of it was written.
                kept = [h for h in runs if h.id not in released]
                log.warning(
                    "release_held_up_by_row_lock",
                    run_ids=sorted(h.id for h in kept),
                    reason="another session holds a run's row locked; tried again later",
                )
            else:
                log.error("release_failed", error=str(exc), runs=len(runs))
        if kept:
            self._life.unrelease(kept)
            runs = [h for h in runs if h not in kept]
        for held in runs:
            if held.id in released:  # queued again, maybe behind this daemon's own bound
                self._bounds.lower(held.run.job_type, held.run.run_at)
        self._life.released(runs, released, let_go)
        return len(released)
