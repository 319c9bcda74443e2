"""The one owner of the runs this process holds: an explicit state per run, changed only by
the named transitions below, under one lock, so that "who may write this run's result" has
one answer. It does no I/O: the worker, the completer, the heartbeat and the drain ask it what
to do, do the database work, and report back.

The invariant: every run this process holds is here, in exactly one state, from the claim
that took it to the write of its result or its release; no other place (a thread's local
list, a result not yet handed to the writer) holds a run. The capacity count, the heartbeat
and the drain read only this: what is held is renewed, counted against the threads, and
written or given back by a clean stop.

    accept ─> CLAIMED ─start─> RUNNING ─finish─> FINISHING ─written─> (gone)
               │                │ ├─timeout─> TIMED_OUT ─finish─> FINISHING (the timeout's failure)
               │                │ │             ├─lost, cancelled─> LOST (as from RUNNING)
               │                │ │             └─end of drain─> FINISHING (the timeout's failure)
               │                │ ├─begin_commit─> COMMITTING ─end_commit─> COMMITTED
               │                │ │                    │            COMMITTED ─finish─> (gone)
               │                │ │                    └─not committed─> RUNNING (or LOST)
               │                │ ├─lost─> LOST ─finish─> (gone)
               │                │ ├─cancelled─> LOST ─finish─> FINISHING (let go) ─written─> (gone)
               │                │ └─finish, stopped by the drain─> INTERRUPTED ─release─> (gone)
               │                └─release (end of drain, Python handler still running)─> (gone)
               ├─lost─> (gone)
               ├─cancelled─> FINISHING (let go) ─written─> (gone)
               └─release (drain, or waited too long for a thread)─> RELEASING ─released─> (gone)

A run an operator cancelled stays held (its lease renewed) until its handler has stopped and
the holder has let go of it in the database: until then no retry can start a second copy. So
does a Python run past its timeout (a thread cannot be killed): it stays running in the
database, its slot counted by the limits, until its handler returns, whatever it returns; its
failure (the timeout) is written then, and only then may its retry be claimed.
A claimed run waits for a thread only as long as its lease is known to be alive (during an
outage it may have expired and been taken elsewhere) and, once nothing starts it for a while,
goes back to the queue rather than being renewed for as long as the threads are busy.

A transition asked for in any other state is refused (it returns False or None and changes
nothing): races between a handler, the heartbeat and a timeout are normal, and the state
decides which of them wins.

``Lifecycle`` stays one class (some 430 lines) on purpose: every transition reads and writes
the same table of held runs under the same lock, and splitting it would put that lock (and the
answer to "who may write this result") in two places. What is not a transition lives apart:
the held run and its states (held.py), the counting of outcomes (tally.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import structlog

from pgtick.core import handlers
from pgtick.core.held import (
    LEASE_WAIT_SECONDS,
    UNSTARTED_MAX_WAIT_SECONDS,
    WRITING,
    DrainReport,
    Held,
    HeldTable,
    State,
)
from pgtick.core.outcome import Outcome
from pgtick.core.tally import Tally
from pgtick.observability.metrics import Metrics
from pgtick.storage.store import FailResult

# Held, State and the constants are read from here too (the worker, the tests).
__all__ = ["UNSTARTED_MAX_WAIT_SECONDS", "DrainReport", "Held", "Lifecycle", "State"]

log = structlog.get_logger("pgtick.lifecycle")


class Lifecycle(HeldTable):
    """Every run held by this process, and the only code that changes their state."""

    def __init__(
        self,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        *,
        log_each_run: bool = False,
        min_lease_seconds: float = math.inf,
    ) -> None:
        super().__init__(clock, min_lease_seconds)
        self._metrics = metrics
        # Called when a run with a timeout starts (the heartbeat sets it: it enforces them).
        self.on_deadline: Callable[[], None] = lambda: None
        metrics.count_busy(lambda: self._active)
        self.tally = Tally(metrics, log_each_run)  # the counters, the summary and run lines

    @property
    def finished_total(self) -> int:
        """Attempts ended here (a release is not an end)."""
        return self.tally.finished_total

    def take_summary(self) -> dict[str, dict[str, int]]:
        return self.tally.take_summary()

    # -- the heartbeat's knowledge of the leases ----------------------------------------------

    def confirm(
        self, sent_at: float, renewed: Iterable[int], skipped: Iterable[int] = ()
    ) -> list[int]:
        """A heartbeat sent at ``sent_at`` (monotonic) renewed these leases and re-checked
        every other one but the ``skipped`` (row-locked by another transaction, not renewed).
        A skipped run whose outcome we are writing is decided by that write; any other one
        leaves the leases not all known renewed, so claims wait as after a failed beat.
        Returns those (sorted), for the log."""
        with self._changed:
            blocking = sorted(
                rid
                for rid in skipped
                if (held := self._held.get(rid)) is not None and held.state not in WRITING
            )
            if not blocking:
                self._confirmed_at = max(self._confirmed_at, sent_at)
            for rid in renewed:
                held = self._held.get(rid)
                if held is not None:
                    held.lease_until = max(held.lease_until, sent_at + held.job_type.lease_seconds)
            self._changed.notify_all()
            return blocking

    # -- claiming and starting ----------------------------------------------------------------

    def accept(self, fresh: Sequence[Held], sent_at: float | None = None) -> list[Held]:
        """Take freshly claimed runs (``sent_at``: when the claim statement was sent, the
        earliest its leases can have started); returns those refused because the drain has
        begun (the caller releases them at once)."""
        replaced = []
        superseded = []
        now = self._clock()
        with self._lock:
            if self._closed:
                return list(fresh)
            if not self._held:
                # Nothing was held: every lease held now is one this claim just took, so the
                # leases are known renewed as of its sending, however long ago the last beat
                # was (an idle worker process does not beat: service/beats.py).
                self._confirmed_at = max(self._confirmed_at, now if sent_at is None else sent_at)
            for held in fresh:
                old = self._held.get(held.id)
                if old is not None and old.handler_active:
                    # Our lease ran out (an outage) and the run came back to us while its
                    # old handler still runs: that copy is lost; the new one waits for it.
                    old.state = State.LOST
                    old.gone = old.gone or "lost"
                    old.ctx.cancelled.set()
                    self._replaced[held.id] = old
                    replaced.append(old)
                elif old is not None:
                    # An older claim no handler runs: its lease is gone. Never started, it
                    # is counted now; a result on its way is refused by the claim guard.
                    old.gone = "lost"
                    if old.state is State.CLAIMED:
                        old.state = State.LOST  # a thread that pops it will not start it
                        self._waiting -= 1
                        superseded.append(old)
                held.state = State.CLAIMED
                self._waiting += 1
                held.claimed_at = now
                held.lease_until = (now if sent_at is None else sent_at) + (
                    held.job_type.lease_seconds
                )
                self._held[held.id] = held
        self.tally.replaced(replaced, superseded)
        return []

    def start(self, held: Held) -> bool:
        """CLAIMED -> RUNNING: a thread may run the handler now (once an older copy of the
        same run, replaced after an outage, has returned: never two copies at once here)."""
        with self._changed:
            while held.id in self._replaced and self._held.get(held.id) is held:
                self._changed.wait()
            while (
                not self._closed
                and self._held.get(held.id) is held
                and held.state is State.CLAIMED
                and held.lease_until <= self._clock()
            ):
                # Its lease may have expired while the heartbeat could not renew it (an
                # outage), and another daemon may run it now: wait until a heartbeat has
                # renewed it, or found it gone.
                self._changed.wait(LEASE_WAIT_SECONDS)
            if self._closed or self._held.get(held.id) is not held:
                return False  # the drain began: unstarted runs are released, not started
            if held.state is not State.CLAIMED:
                return False
            held.state = State.RUNNING
            self._waiting -= 1
            held.handler_active = True
            held.started_at = self._last_start = self._clock()
            timeout = held.job_type.config.timeout_seconds
            if timeout is not None and held.job_type.fn is not None:
                held.deadline = held.started_at + timeout
                self.on_deadline()  # the heartbeat, which enforces it, may sleep past it
            self._active += 1
            self._active_commands += held.is_command
        # The start delay (the claim's start minus run_at), queued by the thread that starts
        # the run rather than by the dispatcher, whose time every run of a backlog waits on;
        # a run given back unstarted is not counted. The result writer observes it.
        run = held.run
        self._metrics.run_started(run.job_type, (run.started_at - run.run_at).total_seconds())
        return True

    # -- ctx.transaction() ----------------------------------------------------------------------

    def begin_commit(self, run_id: int) -> bool:
        """RUNNING -> COMMITTING: the handler's transaction may commit the success."""
        with self._lock:
            held = self._held.get(run_id)
            if held is None or held.state is not State.RUNNING:
                return False
            held.state = State.COMMITTING
            return True

    def end_commit(self, run_id: int, committed: bool) -> None:
        """COMMITTING -> COMMITTED, or back to RUNNING (LOST if a heartbeat saw the lease go
        meanwhile) when the transaction did not commit."""
        with self._lock:
            held = self._held.get(run_id)
            if held is None or held.state is not State.COMMITTING:
                return
            if committed:
                held.state = State.COMMITTED
            elif held.gone is not None:
                held.state = State.LOST
                held.ctx.cancelled.set()
            else:
                held.state = State.RUNNING

    # -- the handler returned -------------------------------------------------------------------

    def finish(self, held: Held, outcome: Outcome, duration: float) -> Outcome | None:
        """The handler returned: the outcome to write (RUNNING -> FINISHING; TIMED_OUT ->
        FINISHING with the timeout's failure), or None when there is nothing to write
        (committed by the handler, lost, interrupted)."""
        with self._lock:
            self._returned(held)
            state = held.state
            if self._replaced.get(held.id) is held:
                del self._replaced[held.id]  # a newer copy holds the run now
                gone: str | None = held.gone or "lost"
            elif self._held.get(held.id) is not held:
                return None  # written meanwhile (a drain's last writes): nothing more to say
            elif state is State.TIMED_OUT and held.expired is not None:
                # Whatever it returned: the attempt failed by its timeout, and is written
                # now that no copy of it runs any more (its duration the handler's own).
                held.state = State.FINISHING
                return held.expired
            elif state is State.RUNNING:
                if self._interrupting and outcome.kind != "succeeded":
                    # Stopped by the shutdown, not by its own fault: released, not counted.
                    held.state = State.INTERRUPTED
                    return None
                held.state = State.FINISHING
                if outcome.kind in ("succeeded", "failed", "dead"):
                    return outcome
                # "lost": transaction() found the run no longer ours before the heartbeat
                # did; "interrupted": a command stopped by a cancel that was not the drain's.
                # Either way no result: let go of the run if an operator cancelled it (the
                # writer finds out which), else its lease is gone.
                return Outcome(held.id, "cancelled")
            elif state is State.COMMITTED:
                del self._held[held.id]
                gone = None
            elif state is State.LOST and held.gone == "cancelled":
                held.state = State.FINISHING  # the handler has stopped: let go of the run
                return Outcome(held.id, "cancelled")
            elif state is State.LOST:
                del self._held[held.id]
                gone = held.gone or "lost"
            elif state is State.RELEASING and outcome.kind == "succeeded":
                held.returned = outcome  # set aside for the exit: its success written then
                return None
            else:
                return None  # FINISHING: the drain is writing its timeout's failure
        self.tally.returned(held, gone, outcome, duration)
        return None

    def _returned(self, held: Held) -> None:
        """Under the lock: ``held``'s handler has returned (if it was running one)."""
        if not held.handler_active:
            return
        held.handler_active = False
        self._active -= 1
        self._active_commands -= held.is_command
        self._changed.notify_all()

    # -- timeouts ---------------------------------------------------------------------------------

    def expire(self) -> tuple[list[Held], float | None]:
        """RUNNING -> TIMED_OUT for Python handlers past their timeout (told to stop, their
        failure kept for when they return): those, and the next deadline (monotonic) to
        check. Python cannot stop the thread, so the run stays held, and counted, until the
        handler returns."""
        now = self._clock()
        expired: list[Held] = []
        next_deadline: float | None = None
        with self._lock:
            for held in self._held.values():
                if held.deadline is None or held.state is not State.RUNNING:
                    continue
                if held.deadline <= now:
                    seconds = held.job_type.config.timeout_seconds or 0.0
                    message = f"timed out after {seconds:g}s"
                    held.expired = handlers.failed(
                        held.ctx, held.job_type, message, "timeout", message
                    )
                    held.state = State.TIMED_OUT
                    expired.append(held)
                elif next_deadline is None or held.deadline < next_deadline:
                    next_deadline = held.deadline
        for held in expired:
            held.ctx.cancelled.set()
        return expired, next_deadline

    # -- the heartbeat ----------------------------------------------------------------------------

    def lost(
        self,
        gone: Iterable[int],
        cancelled: Iterable[int] = (),
        attempts: Mapping[int, int] | None = None,
    ) -> list[Held]:
        """The heartbeat found these leases gone (``cancelled``: by an operator). Handlers are
        told to stop and their results dropped; a run already finishing or committed is left to
        the write that is deciding it. Returns the runs given up; those now FINISHING (never
        started, or stopped by the drain, and cancelled) are to be let go of by the writer.
        ``attempts``: the attempt each lease the beat asked about was for; a run held now
        under another attempt (its result written and the run claimed again while the beat
        was out) is a claim the beat did not ask about, and is kept."""
        cancelled = set(cancelled)
        given_up: list[Held] = []
        with self._changed:
            for rid in gone:
                held = self._held.get(rid)
                if held is None:
                    continue
                if attempts is not None and attempts.get(rid, held.run.attempt) != held.run.attempt:
                    continue
                reason = "cancelled" if rid in cancelled else "lost"
                if held.state is State.COMMITTING:
                    held.gone = reason  # decided by end_commit
                elif held.state in (State.RUNNING, State.TIMED_OUT):
                    held.state = State.LOST
                    held.gone = reason
                    held.ctx.cancelled.set()
                    given_up.append(held)
                elif held.state in (State.CLAIMED, State.INTERRUPTED):
                    held.gone = reason
                    self._waiting -= held.state is State.CLAIMED
                    if reason == "cancelled":
                        held.state = State.FINISHING  # still ours in the database
                    else:
                        del self._held[rid]
                    given_up.append(held)
                elif held.state in (State.FINISHING, State.RELEASING):
                    held.gone = held.gone or reason  # no longer renewed; the write decides
            self._changed.notify_all()  # a thread waiting to start one of them gives up
        self.tally.given_up(given_up)
        return given_up

    # -- the completer ----------------------------------------------------------------------------

    def written(
        self,
        batch: Sequence[tuple[Held, Outcome, float | None]],
        succeeded: set[int],
        failed: Mapping[int, FailResult],
        let_go: Iterable[int] = (),
    ) -> None:
        """FINISHING -> gone once the batch's transaction committed. A run the claim guard
        did not let the write change was no longer ours: cancelled by an operator (``let_go``:
        we let go of it since) or lost (its lease expired and another daemon has it)."""
        let_go = set(let_go)
        with self._lock:
            mine = [item for item in batch if self._take_written(item[0])]
        self.tally.written(mine, succeeded, failed, let_go)

    def _take_written(self, held: Held) -> bool:
        """Under the lock: whether a result written for ``held`` is ours to record (it was
        FINISHING), and no longer held."""
        if held.state is not State.FINISHING:
            return False
        if self._held.get(held.id) is held:
            del self._held[held.id]
            return True
        if held.gone == "lost":  # a newer claim of the run replaced it
            held.state = State.LOST
            return True
        return False

    # -- shutdown -------------------------------------------------------------------------------

    def close(self) -> None:
        """The drain began: refuse new claims, and start no claimed run, from here on."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def unstarted(self, waited: float = 0.0) -> list[Held]:
        """CLAIMED -> RELEASING: claimed runs no thread started (``waited``: those waiting
        for at least that many seconds)."""
        before = self._clock() - waited
        with self._lock:
            out = [
                h
                for h in self._held.values()
                if h.state is State.CLAIMED and h.claimed_at <= before
            ]
            for held in out:
                held.state = State.RELEASING
            self._waiting -= len(out)
        return out

    def unrelease(self, runs: Sequence[Held]) -> None:
        """RELEASING -> CLAIMED: runs whose release was not written (a row lock outlasted
        its wait); still ours, to be released again or started."""
        with self._changed:
            for held in runs:
                if self._held.get(held.id) is held and held.state is State.RELEASING:
                    held.state = State.CLAIMED
                    self._waiting += 1
            self._changed.notify_all()

    def interrupt(self) -> int:
        """Tell every running handler to stop (commands are killed); from now on a handler
        that returns without success is released, not counted as a failure."""
        with self._lock:
            self._interrupting = True
            running = [
                h
                for h in self._held.values()
                if h.handler_active and h.state in (State.RUNNING, State.COMMITTING)
            ]
        for held in running:
            held.ctx.cancelled.set()
        return len(running)

    def wait_idle(
        self,
        timeout: float,
        interrupt: threading.Event | None = None,
        *,
        commands_only: bool = False,
    ) -> bool:
        """Wait until no thread is inside a handler (``commands_only``: a command handler),
        up to ``timeout`` or until ``interrupt`` is set."""
        deadline = self._clock() + timeout
        with self._changed:
            while self._active_commands if commands_only else self._active:
                left = deadline - self._clock()
                if left <= 0 or (interrupt is not None and interrupt.is_set()):
                    return False
                self._changed.wait(min(left, 0.1))
        return True

    def leftovers(self) -> DrainReport:
        """End of the drain: what to release. A command whose handler has not returned may
        still have processes alive, so its run is not released (its lease expires and the
        reaper decides); a Python handler dies with this process, so its run is released at
        its exit (not before: it still runs), or, past its timeout, failed at its exit
        (TIMED_OUT -> FINISHING; drain.release_at_exit)."""
        release: list[Held] = []
        left: list[Held] = []
        timed_out: list[Held] = []
        at_exit: list[Held] = []
        with self._lock:
            for held in self._held.values():
                if held.state in (State.CLAIMED, State.INTERRUPTED, State.RELEASING):
                    release.append(held)
                elif held.state is State.TIMED_OUT:
                    held.state = State.FINISHING
                    timed_out.append(held)
                elif held.state is State.RUNNING or (
                    held.state is State.LOST and held.gone == "cancelled"
                ):
                    (left if held.is_command else at_exit).append(held)
            for held in release + at_exit:
                self._waiting -= held.state is State.CLAIMED
                held.state = State.RELEASING
        return DrainReport(release, left, timed_out, at_exit)

    def released(
        self, runs: Sequence[Held], released_ids: set[int], let_go: Iterable[int] = ()
    ) -> None:
        """RELEASING -> gone once the release statement ran (or could not); ``let_go``: runs
        an operator had cancelled meanwhile, let go of instead."""
        let_go = set(let_go)
        mine = []
        with self._lock:
            for held in runs:
                if self._held.get(held.id) is held and held.state is State.RELEASING:
                    del self._held[held.id]
                    mine.append(held)
        for held in mine:
            if held.id in released_ids:
                self.tally.record(held, "released", None)
            elif held.id in let_go:
                self.tally.record(held, "cancelled", None)
