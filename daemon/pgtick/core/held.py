"""A run held by this process (``Held``), the states the lifecycle moves it through, and the
table of held runs with its lock and what reading it tells (``HeldTable``): the data of
lifecycle.py, apart from its transitions, which alone change it, under that one lock.
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pgtick.core.handlers import JobContext, JobType
from pgtick.core.outcome import Outcome
from pgtick.storage.store import ClaimedRun, Lease


class State(enum.Enum):
    CLAIMED = "claimed"  # accepted from a claim, waiting for a thread
    RUNNING = "running"  # a thread runs its handler
    COMMITTING = "committing"  # ctx.transaction() is committing the run's success
    COMMITTED = "committed"  # the success is committed; the handler may still be returning
    FINISHING = "finishing"  # an outcome is on its way to the database
    # Past its timeout, its Python handler not returned yet: held until it does, then the
    # timeout's failure is written (whatever the handler returned).
    TIMED_OUT = "timed_out"
    LOST = "lost"  # the lease is gone (lost or cancelled): the handler's result is dropped
    INTERRUPTED = "interrupted"  # stopped by the drain: to be released
    RELEASING = "releasing"  # being given back to the queue


# How long a claimed run waits for a thread before it goes back to the queue (checked at each
# heartbeat): runs are claimed ahead for the threads to start within milliseconds, so one
# still waiting after this is held back by handlers that turned out slow.
UNSTARTED_MAX_WAIT_SECONDS = 1.0
# How often a thread about to start a run whose lease is unconfirmed looks again.
LEASE_WAIT_SECONDS = 0.5

# States in which the database still holds the run for us: the heartbeat renews these.
LEASED = frozenset(
    {
        State.CLAIMED,
        State.RUNNING,
        State.COMMITTING,
        State.TIMED_OUT,
        State.FINISHING,
        State.INTERRUPTED,
        State.RELEASING,
    }
)

# States in which our own write of the run's outcome (or its release) may hold its row lock.
WRITING = frozenset({State.COMMITTING, State.FINISHING, State.RELEASING})


@dataclass(eq=False)
class Held:
    """A run this process holds, from claim until its result is written or it is let go."""

    run: ClaimedRun
    ctx: JobContext
    job_type: JobType
    state: State = State.CLAIMED
    started_at: float | None = None  # monotonic, when a thread picked it up
    deadline: float | None = None  # monotonic, Python handlers with a timeout
    expired: Outcome | None = None  # past the deadline: the failure to write once it returns
    # Set aside for the exit (DrainReport.at_exit), its handler then returned a success:
    # written at the exit instead of the release (torture seed 4318, run 3206).
    returned: Outcome | None = None
    handler_active: bool = False  # a thread is inside its handler right now
    # "lost": the lease is gone; "cancelled": an operator cancelled the run, which stays ours
    # until we let go of it. Set by the heartbeat (or a newer claim of the same run).
    gone: str | None = None
    claimed_at: float = 0.0  # monotonic, when accepted
    lease_until: float = math.inf  # monotonic: the lease surely lasts until then

    @property
    def id(self) -> int:
        return self.run.id

    @property
    def is_command(self) -> bool:
        return self.job_type.command is not None


@dataclass(frozen=True)
class DrainReport:
    """What the drain leaves behind, for its last log line."""

    release: list[Held]  # to give back to the queue: no handler of ours runs them
    left_running: list[Held]  # command handlers whose process group may still be alive
    # Python runs past their timeout whose handlers never returned (they die with this
    # process): the timeout's failure to write.
    timed_out: list[Held] = field(default_factory=list)
    # Python handlers still running (they ignore the cancel): given back as the process's
    # last act, held off for a moment, since they run until it ends.
    at_exit: list[Held] = field(default_factory=list)


def fields(held: Held) -> dict[str, object]:
    """The fields of a run's log lines: run id, job type, attempt (and its trace, if any)."""
    out: dict[str, object] = {
        "run_id": held.id,
        "job_type": held.run.job_type,
        "attempt": held.run.attempt,
    }
    ids = held.ctx.trace_ids
    if ids is not None:
        out["trace_id"], out["span_id"] = ids
    return out


class HeldTable:
    """The held runs by id, the one lock over them, and the reads. ``Lifecycle`` extends it
    with the transitions: one object, one lock, one owner."""

    def __init__(self, clock: Callable[[], float], min_lease_seconds: float) -> None:
        self._clock = clock
        self._min_lease = min_lease_seconds
        self._confirmed_at = clock()  # when the last heartbeat that renewed every lease left
        self._last_start = -math.inf  # monotonic, the latest start()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._held: dict[int, Held] = {}
        # Copies replaced by a new claim of the same run whose handler has not returned yet
        # (the lease expired during an outage and the run was reaped): the new copy waits.
        self._replaced: dict[int, Held] = {}
        self._active = 0  # threads inside a handler
        self._waiting = 0  # runs held in CLAIMED: waiting for a thread
        self._active_commands = 0  # of which run a command handler
        self._closed = False  # no more claims accepted
        self._interrupting = False  # the drain told handlers to stop

    def state(self, run_id: int) -> State | None:
        with self._lock:
            held = self._held.get(run_id)
            return None if held is None else held.state

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def active(self) -> int:
        """Threads inside a handler now."""
        return self._active

    def occupied(self) -> int:
        """Runs that have a thread or wait for one: what the claims are bounded by."""
        return self._active + self._waiting

    def since_last_start(self) -> float:
        """Seconds since a thread last started a handler."""
        return self._clock() - self._last_start

    def leases(self) -> dict[int, Lease]:
        """{run id: lease} of every run the database holds for us: those in a leased state
        not found gone, and those an operator cancelled that we have not let go of yet."""
        with self._lock:
            return {
                rid: Lease(rid, h.run.attempt, h.job_type.lease_seconds)
                for rid, h in self._held.items()
                if (h.state in LEASED and h.gone != "lost")
                or (h.state is State.LOST and h.gone == "cancelled")
            }

    def lease_ends(self, run_ids: Iterable[int]) -> list[float]:
        """The (monotonic) ends of these runs' leases as last known renewed, of those held."""
        with self._lock:
            return [h.lease_until for rid in run_ids if (h := self._held.get(rid)) is not None]

    def may_claim(self) -> bool:
        """False while a lease we hold may have expired unnoticed (the heartbeat could not
        renew it): a claim now could take again a run this process still holds."""
        with self._lock:
            return not self._held or self._clock() < self._confirmed_at + self._min_lease
