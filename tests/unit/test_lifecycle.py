"""The lifecycle owner's transitions, without a database, processes or sleeps: every legal
transition does what it says, every other one is refused and changes nothing."""

from __future__ import annotations

import io
import json
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog

from pgtick.config import JobTypeConfig
from pgtick.core.handlers import JobContext, JobType
from pgtick.core.lifecycle import Held, Lifecycle, State
from pgtick.core.outcome import Outcome
from pgtick.observability.logs import configure_logging
from pgtick.observability.metrics import Metrics
from pgtick.storage.store import ClaimedRun, FailResult

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _fn(ctx: JobContext, payload: Any) -> None:
    return None


PY = JobType(JobTypeConfig("py", timeout_seconds=5.0), lease_seconds=60.0, fn=_fn)
CMD = JobType(JobTypeConfig("cmd"), lease_seconds=30.0, command=("/bin/true",))


def metric(m: Metrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def attempts(m: Metrics, job_type: str, outcome: str) -> float:
    return metric(m, "pgtick_run_attempts_total", job_type=job_type, outcome=outcome)


class World:
    """A lifecycle and a way to make held runs for it."""

    def __init__(self) -> None:
        self.metrics = Metrics({"py": PY, "cmd": CMD}, "test", 4)
        self.clock = Clock()
        self.life = Lifecycle(self.metrics, clock=self.clock)
        self._next = 1

    def held(self, jt: JobType = PY, attempt: int = 1, max_attempts: int = 3) -> Held:
        run_id, self._next = self._next, self._next + 1
        run = ClaimedRun(
            id=run_id,
            job_type=jt.name,
            payload_json="{}",
            attempt=attempt,
            max_attempts=max_attempts,
            scheduled_for=None,
            idempotency_key=None,
            run_at=T0,
            schedule_id=None,
            started_at=T0 + timedelta(seconds=1),
            locked_until=T0 + timedelta(seconds=61),
        )
        ctx = JobContext(
            run_id=run_id,
            job_type=jt.name,
            attempt=attempt,
            max_attempts=max_attempts,
            scheduled_for=None,
            idempotency_key=None,
            _store=None,  # type: ignore[arg-type]  # never touched: no I/O here
            _worker_id="w",
            _guard=self.life,
        )
        return Held(run, ctx, jt)

    def accepted(self, jt: JobType = PY, **kw: Any) -> Held:
        h = self.held(jt, **kw)
        assert self.life.accept([h]) == []
        return h

    def running(self, jt: JobType = PY, **kw: Any) -> Held:
        h = self.accepted(jt, **kw)
        assert self.life.start(h)
        return h

    def finishing(self, jt: JobType = PY, **kw: Any) -> Held:
        h = self.running(jt, **kw)
        out = Outcome(h.id, "succeeded")
        assert self.life.finish(h, out, 0.1) == out
        return h

    def committed(self) -> Held:
        h = self.running()
        assert self.life.begin_commit(h.id)
        self.life.end_commit(h.id, committed=True)
        return h

    def lost(self) -> Held:
        h = self.running()
        self.life.lost({h.id})
        return h

    def timed_out(self) -> Held:
        h = self.running()
        self.clock.now = h.deadline or 0.0
        assert self.life.expire()[0] == [h]
        return h

    def interrupted(self) -> Held:
        h = self.running()
        self.life.interrupt()
        assert self.life.finish(h, Outcome(h.id, "interrupted"), 0.1) is None
        return h

    def releasing(self) -> Held:
        h = self.accepted()
        assert self.life.unstarted() == [h]
        return h


MAKERS = {
    State.CLAIMED: World.accepted,
    State.RUNNING: World.running,
    State.COMMITTED: World.committed,
    State.TIMED_OUT: World.timed_out,
    State.FINISHING: World.finishing,
    State.LOST: World.lost,
    State.INTERRUPTED: World.interrupted,
    State.RELEASING: World.releasing,
}


def in_state(state: State) -> tuple[World, Held]:
    w = World()
    if state is State.COMMITTING:
        h = w.running()
        assert w.life.begin_commit(h.id)
    else:
        h = MAKERS[state](w)
    assert w.life.state(h.id) is state
    return w, h


# -- legal transitions ------------------------------------------------------------------------


def test_claim_start_finish_written_counts_one_success() -> None:
    w = World()
    h = w.held()
    assert w.life.accept([h]) == []
    assert w.life.state(h.id) is State.CLAIMED and h.id in w.life.leases()
    assert w.life.start(h)
    assert w.life.state(h.id) is State.RUNNING and w.life.active == 1
    assert h.deadline == w.clock.now + 5.0  # Python handler with a timeout
    out = Outcome(h.id, "succeeded")
    assert w.life.finish(h, out, 0.25) == out
    assert w.life.state(h.id) is State.FINISHING and w.life.active == 0
    assert h.id in w.life.leases()  # renewed until written
    w.life.written([(h, out, 0.25)], {h.id}, {})
    assert w.life.state(h.id) is None and w.life.held_count() == 0
    assert attempts(w.metrics, "py", "succeeded") == 1
    assert w.life.take_summary() == {"py": {"succeeded": 1}}
    assert w.life.take_summary() == {}


def test_failed_and_dead_are_counted_from_what_the_database_recorded() -> None:
    w = World()
    a, b = w.running(), w.running()
    fa = Outcome(a.id, "failed", "E: x", "E", "tb", 10.0)
    fb = Outcome(b.id, "dead", "E: y", "E", "tb", None)
    assert w.life.finish(a, fa, 0.1) == fa
    assert w.life.finish(b, fb, 0.1) == fb
    results = {a.id: FailResult(a.id, "failed", T0), b.id: FailResult(b.id, "dead", T0)}
    w.life.written([(a, fa, 0.1), (b, fb, 0.1)], set(), results)
    assert w.life.held_count() == 0
    assert attempts(w.metrics, "py", "failed") == 2
    assert w.life.take_summary() == {"py": {"failed": 1, "dead": 1}}


def test_a_write_the_lease_guard_refused_is_a_lost_lease() -> None:
    w = World()
    h = w.finishing()
    w.life.written([(h, Outcome(h.id, "succeeded"), 0.1)], set(), {})
    assert w.life.held_count() == 0
    assert attempts(w.metrics, "py", "lost") == 1
    assert metric(w.metrics, "pgtick_leases_lost_total", job_type="py") == 1


def test_commit_by_the_handler_then_heartbeat_sees_the_lease_gone() -> None:
    """Bug 4: a run committed through ctx.transaction() is not lost when the heartbeat then
    finds its lease gone (the commit cleared it): no cancel, no lost count."""
    w, h = in_state(State.COMMITTED)
    assert h.id not in w.life.leases()  # the database holds it for nobody now
    assert w.life.lost({h.id}) == []
    assert not h.ctx.cancelled.is_set()
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 0.1) is None
    assert attempts(w.metrics, "py", "succeeded") == 1
    assert attempts(w.metrics, "py", "lost") == 0
    assert metric(w.metrics, "pgtick_leases_lost_total", job_type="py") == 0


def test_heartbeat_during_the_commit_is_decided_by_the_commit() -> None:
    w, h = in_state(State.COMMITTING)
    assert w.life.lost({h.id}) == []  # undecided yet
    w.life.end_commit(h.id, committed=True)
    assert w.life.state(h.id) is State.COMMITTED and not h.ctx.cancelled.is_set()

    w, h = in_state(State.COMMITTING)
    w.life.lost({h.id})
    w.life.end_commit(h.id, committed=False)  # the lease really was gone
    assert w.life.state(h.id) is State.LOST and h.ctx.cancelled.is_set()


def test_a_commit_that_did_not_happen_returns_to_running() -> None:
    w, h = in_state(State.COMMITTING)
    w.life.end_commit(h.id, committed=False)
    assert w.life.state(h.id) is State.RUNNING


def test_an_error_after_the_commit_keeps_the_success() -> None:
    w, h = in_state(State.COMMITTED)
    failure = Outcome(h.id, "failed", "E: after", "E", "tb", 1.0)
    assert w.life.finish(h, failure, 0.1) is None
    assert attempts(w.metrics, "py", "succeeded") == 1
    assert attempts(w.metrics, "py", "failed") == 0


def test_lost_while_running_stops_the_handler_and_drops_its_result() -> None:
    w, h = in_state(State.RUNNING)
    assert w.life.lost({h.id}) == [h]
    assert w.life.state(h.id) is State.LOST and h.ctx.cancelled.is_set()
    assert h.id not in w.life.leases()
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 0.1) is None  # dropped
    assert w.life.held_count() == 0 and w.life.active == 0
    assert attempts(w.metrics, "py", "lost") == 1
    assert attempts(w.metrics, "py", "succeeded") == 0
    assert metric(w.metrics, "pgtick_leases_lost_total", job_type="py") == 1


def test_cancelled_while_running_is_held_until_the_handler_stopped_and_let_go() -> None:
    """An operator's cancel: the handler is told to stop, but the run stays ours (its lease
    renewed) until the handler has returned and the writer has let go of it: no second copy
    can start meanwhile. Its result is dropped; it counts as cancelled, not lost."""
    w, h = in_state(State.RUNNING)
    assert w.life.lost({h.id}, {h.id}) == [h]
    assert w.life.state(h.id) is State.LOST and h.ctx.cancelled.is_set()
    assert h.id in w.life.leases()  # still renewed
    let_go = w.life.finish(h, Outcome(h.id, "succeeded"), 0.1)
    assert let_go == Outcome(h.id, "cancelled")
    assert w.life.state(h.id) is State.FINISHING and w.life.active == 0
    w.life.written([(h, let_go, 0.1)], set(), {}, {h.id})
    assert w.life.held_count() == 0
    assert attempts(w.metrics, "py", "cancelled") == 1
    assert attempts(w.metrics, "py", "succeeded") == attempts(w.metrics, "py", "lost") == 0
    assert metric(w.metrics, "pgtick_leases_lost_total", job_type="py") == 0


def test_cancelled_before_a_thread_started_it_is_let_go_of() -> None:
    w, h = in_state(State.CLAIMED)
    assert w.life.lost({h.id}, {h.id}) == [h]
    assert w.life.state(h.id) is State.FINISHING
    assert not w.life.start(h)
    w.life.written([(h, Outcome(h.id, "cancelled"), None)], set(), {}, {h.id})
    assert w.life.held_count() == 0 and attempts(w.metrics, "py", "cancelled") == 1


def test_a_result_refused_because_the_run_was_cancelled_counts_as_cancelled() -> None:
    """The cancel landed between two heartbeats and the handler returned first: the write
    finds the run cancelled (the writer let go of it), which is no lost lease."""
    w = World()
    h = w.finishing()
    w.life.written([(h, Outcome(h.id, "succeeded"), 0.1)], set(), {}, {h.id})
    assert attempts(w.metrics, "py", "cancelled") == 1
    assert attempts(w.metrics, "py", "lost") == 0
    assert metric(w.metrics, "pgtick_leases_lost_total", job_type="py") == 0


@pytest.mark.parametrize("state", list(MAKERS))
def test_occupied_counts_the_runs_with_a_thread_or_waiting_for_one(state: State) -> None:
    w, h = in_state(state)
    w.accepted()  # one more waiting
    waiting = sum(1 for s in (w.life.state(h.id),) if s is State.CLAIMED) + 1
    assert w.life.occupied() == w.life.active + waiting
    w.life.lost({h.id})
    w.life.unstarted()
    assert w.life.occupied() == w.life.active


def test_claims_wait_for_threads_only_for_a_while() -> None:
    w = World()
    old = w.accepted()
    w.clock.now += 2.0
    young = w.accepted()
    assert w.life.occupied() == 2
    assert w.life.unstarted(1.0) == [old]  # given back; the young one still waits
    assert w.life.state(young.id) is State.CLAIMED
    assert w.life.occupied() == 1


def test_no_claim_and_no_start_while_leases_may_have_expired() -> None:
    """No heartbeat renewed the leases for longer than the shortest lease (an outage): a
    claim could take again a run held here, and a claimed run may be someone else's now."""
    w = World()
    w.life = Lifecycle(w.metrics, clock=w.clock, min_lease_seconds=60.0)
    h = w.accepted()
    assert w.life.may_claim()
    w.clock.now += 61.0
    assert not w.life.may_claim()
    w.life.confirm(w.clock.now, {h.id})  # a beat renewed it
    assert w.life.may_claim() and w.life.start(h)


def test_a_claim_after_an_idle_stretch_without_beats_starts_at_once() -> None:
    """An idle worker process sends no beat (service/beats.py: its supervisor keeps its
    workers row alive): a claim into an empty lifecycle is itself the leases' confirmation,
    as of its sending. Once runs are held, only a beat confirms them again."""
    w = World()
    w.life = Lifecycle(w.metrics, clock=w.clock, min_lease_seconds=60.0)
    w.clock.now += 600.0  # ten minutes idle, no beat
    sent_at = w.clock.now - 0.01
    h = w.held()
    assert w.life.accept([h], sent_at) == []
    assert w.life.may_claim() and w.life.start(h)
    w.clock.now += 61.0  # held, and no beat since the claim: the lease may have expired
    assert not w.life.may_claim()
    later = w.held()
    assert w.life.accept([later], w.clock.now) == []  # runs were held: no confirmation
    assert not w.life.may_claim()


def test_a_beat_that_skipped_a_run_locked_elsewhere_confirms_nothing() -> None:
    """The heartbeat skips rows another transaction has locked. One whose outcome we are
    writing is decided by that write; any other one was not renewed, so the leases are not all
    known alive: claims wait as after a failed beat, until a beat renews every lease."""
    w = World()
    w.life = Lifecycle(w.metrics, clock=w.clock, min_lease_seconds=60.0)
    running = w.accepted()
    assert w.life.start(running)
    writing = w.accepted()
    assert w.life.start(writing)
    assert w.life.finish(writing, Outcome(writing.id, "succeeded"), 0.1) is not None
    assert w.life.state(writing.id) is State.FINISHING
    w.clock.now += 61.0
    assert not w.life.may_claim()
    # Our own result's write holds the row: the beat still confirms every lease.
    assert w.life.confirm(w.clock.now, {running.id}, {writing.id}) == []
    assert w.life.may_claim()
    w.clock.now += 61.0
    # A row of a running handler locked by someone else: not confirmed, no claims.
    assert w.life.confirm(w.clock.now, set(), {running.id}) == [running.id]
    assert not w.life.may_claim()
    w.life.confirm(w.clock.now, {running.id})
    assert w.life.may_claim()


def test_lost_before_a_thread_started_it() -> None:
    w, h = in_state(State.CLAIMED)
    assert w.life.lost({h.id}) == [h]
    assert w.life.state(h.id) is None
    assert not w.life.start(h)  # the thread that pops it later does nothing
    assert attempts(w.metrics, "py", "lost") == 1


def test_a_timed_out_run_is_held_until_its_handler_returns_then_failed() -> None:
    """Python cannot stop the thread: past its timeout the run stays held (renewed, its slot
    counted in the database) until the handler returns; whatever it returns then, the
    attempt is the timeout's failure, written only now that no copy of it runs."""
    w, h = in_state(State.RUNNING)
    assert w.life.expire() == ([], h.deadline)
    w.clock.now = h.deadline or 0.0
    assert w.life.expire()[0] == [h]
    assert w.life.state(h.id) is State.TIMED_OUT and h.ctx.cancelled.is_set()
    assert h.expired is not None
    assert (h.expired.kind, h.expired.error_type) == ("failed", "timeout")
    assert h.id in w.life.leases()  # still renewed
    assert w.life.expire() == ([], None)  # once
    assert w.life.active == 1  # its thread is still in the handler
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 9.0) == h.expired
    assert w.life.state(h.id) is State.FINISHING and w.life.active == 0
    w.life.written([(h, h.expired, 9.0)], set(), {h.id: FailResult(h.id, "failed", T0)})
    assert w.life.held_count() == 0
    assert attempts(w.metrics, "py", "failed") == 1
    assert attempts(w.metrics, "py", "succeeded") == 0


def test_a_timed_out_run_cancelled_meanwhile_is_let_go_of_when_its_handler_returns() -> None:
    w, h = in_state(State.TIMED_OUT)
    assert w.life.lost({h.id}, {h.id}) == [h]
    assert w.life.state(h.id) is State.LOST and h.id in w.life.leases()
    assert w.life.finish(h, Outcome(h.id, "failed", "E"), 9.0) == Outcome(h.id, "cancelled")


def test_a_timed_out_run_whose_lease_was_lost_writes_nothing() -> None:
    w, h = in_state(State.TIMED_OUT)
    assert w.life.lost({h.id}) == [h]
    assert h.id not in w.life.leases()
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 9.0) is None
    assert w.life.held_count() == 0 and attempts(w.metrics, "py", "lost") == 1


def test_a_timed_out_run_cannot_commit() -> None:
    w, h = in_state(State.RUNNING)
    w.clock.now = h.deadline or 0.0
    w.life.expire()
    assert not w.life.begin_commit(h.id)


def test_commands_have_no_python_deadline() -> None:
    w = World()
    c = w.accepted(CMD)
    assert w.life.start(c) and c.deadline is None


def test_drain_refuses_claims_releases_unstarted_and_interrupts() -> None:
    w = World()
    waiting, running, command = w.accepted(), w.running(), w.running(CMD)
    w.life.close()
    late = w.held()
    assert w.life.accept([late]) == [late]  # a claim in flight when the drain began
    assert w.life.state(late.id) is None
    assert w.life.unstarted() == [waiting]
    assert w.life.state(waiting.id) is State.RELEASING
    assert not w.life.start(waiting)
    assert w.life.interrupt() == 2
    assert running.ctx.cancelled.is_set() and command.ctx.cancelled.is_set()
    # The Python handler gives up because it was cancelled: released, not a failure.
    failure = Outcome(running.id, "failed", "Retry: cancelled", "Retry", "", 1.0)
    assert w.life.finish(running, failure, 1.0) is None
    assert w.life.state(running.id) is State.INTERRUPTED
    # The command never returned: not released while its processes may live.
    report = w.life.leftovers()
    assert set(report.release) == {waiting, running}
    assert report.left_running == [command]
    w.life.released(report.release, {waiting.id, running.id})
    assert w.life.held_count() == 1
    assert attempts(w.metrics, "py", "released") == 2
    assert attempts(w.metrics, "py", "failed") == 0


def test_a_python_handler_that_never_returns_is_released_at_the_end() -> None:
    """At the process's end, not with the runs no handler runs: it still runs until then."""
    w, h = in_state(State.RUNNING)
    w.life.interrupt()
    report = w.life.leftovers()
    assert (report.release, report.at_exit) == ([], [h])
    assert w.life.state(h.id) is State.RELEASING


def test_a_success_after_the_drain_set_its_run_aside_is_kept_for_the_exit() -> None:
    """Torture seed 4318, run 3206: the handler returned normally after the drain's
    leftovers, and the exit released its run, which ran again. Its success is kept for the
    exit to write; a failure then is still a release (stopped by the shutdown)."""
    w, h = in_state(State.RUNNING)
    w.life.interrupt()
    report = w.life.leftovers()
    assert report.at_exit == [h]
    out = Outcome(h.id, "succeeded", result='{"n": 1}')
    assert w.life.finish(h, out, 1.0) is None  # the exit writes it
    assert h.returned == out
    w2, h2 = in_state(State.RUNNING)
    w2.life.interrupt()
    w2.life.leftovers()
    assert w2.life.finish(h2, Outcome(h2.id, "failed", "Retry: cancelled"), 1.0) is None
    assert h2.returned is None


def test_a_timed_out_handler_returning_during_the_drain_is_failed_by_its_timeout() -> None:
    w, h = in_state(State.TIMED_OUT)
    w.life.interrupt()
    assert w.life.finish(h, Outcome(h.id, "failed", "Retry: cancelled"), 9.0) == h.expired


def test_a_timed_out_handler_that_never_returns_is_failed_at_the_end() -> None:
    """Its attempt did time out: written as the timeout's failure (the retry, if any, after
    its backoff), not released as if the shutdown had stopped it."""
    w, h = in_state(State.TIMED_OUT)
    w.life.interrupt()
    report = w.life.leftovers()
    assert (report.release, report.timed_out) == ([], [h])
    assert w.life.state(h.id) is State.FINISHING
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 40.0) is None  # being written


def test_a_success_during_the_drain_is_still_written() -> None:
    w, h = in_state(State.RUNNING)
    w.life.interrupt()
    out = Outcome(h.id, "succeeded")
    assert w.life.finish(h, out, 1.0) == out


def test_wait_idle_returns_when_the_last_handler_returns() -> None:
    w, h = in_state(State.RUNNING)
    c = w.running(CMD)
    assert not w.life.wait_idle(0.0)
    w.life.finish(c, Outcome(c.id, "interrupted"), 0.1)
    assert w.life.wait_idle(0.0, commands_only=True)
    assert not w.life.wait_idle(0.0)
    w.life.finish(h, Outcome(h.id, "succeeded"), 0.1)
    assert w.life.wait_idle(0.0)


# -- illegal transitions: refused, nothing changes ---------------------------------------------

ALL = list(State)


def _snapshot(w: World, h: Held) -> tuple[Any, ...]:
    counted = [attempts(w.metrics, "py", o) for o in ("succeeded", "failed", "lost", "released")]
    return (
        w.life.state(h.id),
        w.life.active,
        h.ctx.cancelled.is_set(),
        w.life.held_count(),
        *counted,
    )


@pytest.mark.parametrize("state", [s for s in ALL if s is not State.CLAIMED])
def test_start_is_refused_unless_claimed(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    assert not w.life.start(h)
    assert _snapshot(w, h) == before


@pytest.mark.parametrize("state", [s for s in ALL if s is not State.RUNNING])
def test_begin_commit_is_refused_unless_running(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    assert not w.life.begin_commit(h.id)
    assert _snapshot(w, h) == before


@pytest.mark.parametrize("state", [s for s in ALL if s is not State.COMMITTING])
@pytest.mark.parametrize("committed", [True, False])
def test_end_commit_is_ignored_unless_committing(state: State, committed: bool) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    w.life.end_commit(h.id, committed)
    assert _snapshot(w, h) == before


@pytest.mark.parametrize(
    "state", [State.FINISHING, State.COMMITTING, State.COMMITTED, State.LOST, State.RELEASING]
)
def test_lost_leaves_runs_another_transition_is_deciding(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    assert w.life.lost({h.id}) == []
    assert _snapshot(w, h) == before


@pytest.mark.parametrize("state", [s for s in ALL if s is not State.FINISHING])
def test_written_ignores_runs_not_finishing(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    w.life.written([(h, Outcome(h.id, "succeeded"), 0.1)], {h.id}, {})
    assert _snapshot(w, h) == before


@pytest.mark.parametrize("state", [s for s in ALL if s is not State.RELEASING])
def test_released_ignores_runs_not_releasing(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    w.life.released([h], {h.id})
    assert _snapshot(w, h) == before


@pytest.mark.parametrize(
    "state", [State.CLAIMED, State.FINISHING, State.INTERRUPTED, State.RELEASING]
)
def test_finish_without_a_running_handler_writes_nothing(state: State) -> None:
    w, h = in_state(state)
    before = _snapshot(w, h)
    assert w.life.finish(h, Outcome(h.id, "succeeded"), 0.1) is None
    assert _snapshot(w, h) == before


def test_unknown_runs_are_ignored_everywhere() -> None:
    w = World()
    stranger = w.held()
    assert not w.life.start(stranger)
    assert not w.life.begin_commit(stranger.id)
    w.life.end_commit(stranger.id, True)
    assert w.life.lost({stranger.id}) == []
    assert w.life.finish(stranger, Outcome(stranger.id, "succeeded"), 0.1) is None
    w.life.written([(stranger, Outcome(stranger.id, "succeeded"), 0.1)], {stranger.id}, {})
    w.life.released([stranger], {stranger.id})
    assert w.life.held_count() == 0
    assert attempts(w.metrics, "py", "succeeded") == 0


def test_nothing_claimed_is_started_once_the_drain_began() -> None:
    w, h = in_state(State.CLAIMED)
    w.life.close()
    assert not w.life.start(h)
    assert w.life.state(h.id) is State.CLAIMED  # released by the drain, never started
    assert w.life.unstarted() == [h]


def test_a_runs_cancelled_event_is_one_event_whoever_asks_first() -> None:
    """The event is made on first use (most runs never need one): a heartbeat setting it while
    the handler first waits on it must reach that same event."""
    h = World().held()
    assert h.ctx._cancelled is None
    seen: list[threading.Event] = []
    barrier = threading.Barrier(8)

    def ask() -> None:
        barrier.wait()
        seen.append(h.ctx.cancelled)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(e) for e in seen}) == 1
    h.ctx.cancelled.set()
    assert all(e.is_set() for e in seen)


def test_the_start_delay_is_counted_when_a_thread_starts_the_run() -> None:
    """Observed by the thread that starts the run (not by the dispatcher at the claim): the
    claim's start minus run_at (1 s in World's runs); a run given back unstarted has none."""
    w = World()
    started, unstarted = w.accepted(), w.accepted()
    delay = "pgtick_run_start_delay_seconds"
    assert metric(w.metrics, f"{delay}_count", job_type="py") == 0
    assert w.life.start(started)
    assert metric(w.metrics, f"{delay}_count", job_type="py") == 1
    assert metric(w.metrics, f"{delay}_sum", job_type="py") == 1.0
    w.life.close()
    assert w.life.unstarted() == [unstarted]
    assert metric(w.metrics, f"{delay}_count", job_type="py") == 1


def test_busy_threads_is_what_runs_when_collected() -> None:
    """The gauge is read from the lifecycle at collection, not set by the threads per run."""
    w = World()
    busy = "pgtick_worker_busy_threads"
    first, second = w.running(), w.running()
    assert metric(w.metrics, busy) == 2
    w.life.finish(first, Outcome(first.id, "succeeded"), 0.1)
    assert metric(w.metrics, busy) == 1
    w.life.finish(second, Outcome(second.id, "failed", "boom"), 0.1)
    assert metric(w.metrics, busy) == 0


def test_start_delays_queued_by_many_threads_are_each_observed_once() -> None:
    """Threads queue delays while others flush (the result writer, a scrape): none is lost
    and none counted twice."""
    m = Metrics({"py": PY}, "test", 8)
    per_thread, threads = 5_000, 8
    go = threading.Barrier(threads + 1)

    def start_runs() -> None:
        go.wait()
        for _ in range(per_thread):
            m.run_started("py", 0.002)

    def flush_meanwhile() -> None:
        go.wait()
        while any(t.is_alive() for t in starters):
            m.flush()

    starters = [threading.Thread(target=start_runs) for _ in range(threads)]
    flusher = threading.Thread(target=flush_meanwhile)
    for t in [*starters, flusher]:
        t.start()
    for t in [*starters, flusher]:
        t.join()
    delay = "pgtick_run_start_delay_seconds"
    assert metric(m, f"{delay}_count", job_type="py") == per_thread * threads
    assert metric(m, f"{delay}_bucket", job_type="py", le="0.005") == per_thread * threads


@pytest.mark.parametrize("level", ["debug", "info"])
def test_successes_are_counted_per_batch_and_logged_only_at_debug(level: str) -> None:
    """A batch's successes: each counted (attempts, the summary's tally, durations where a
    handler ran), and a `run_succeeded` line each only when the log level is debug."""
    stream = io.StringIO()
    root = logging.getLogger()
    handlers_before, level_before = list(root.handlers), root.level
    configure_logging("json", level, stream)
    try:
        w = World()
        batch = [w.finishing() for _ in range(3)]
        # A success with no handler time (None) is counted, its duration not observed.
        times = [0.002, 0.002, None]
        results = [(h, Outcome(h.id, "succeeded"), t) for h, t in zip(batch, times, strict=True)]
        w.life.written(results, {h.id for h in batch}, {})
    finally:
        for handler in [h for h in root.handlers if h not in handlers_before]:
            root.removeHandler(handler)
        root.setLevel(level_before)
        structlog.reset_defaults()
    assert attempts(w.metrics, "py", "succeeded") == 3
    count = "pgtick_run_duration_seconds_count"
    assert metric(w.metrics, count, job_type="py", outcome="succeeded") == 2
    assert w.life.take_summary() == {"py": {"succeeded": 3}}
    assert w.life.finished_total == 3
    logged = [
        json.loads(line)["run_id"]
        for line in stream.getvalue().splitlines()
        if json.loads(line)["event"] == "run_succeeded"
    ]
    assert logged == ([h.id for h in batch] if level == "debug" else [])
