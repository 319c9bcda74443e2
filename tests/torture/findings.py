"""What every guarantee's check shares: a finding (a violation, or a documented exception
with its excuse) with the slice of history that shows it, and the questions the checks ask of
the model (the final attempts of some runs, whether a daemon had a documented reason to lose
its leases at some moment, whether an operator held a row locked)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tests.torture.history import Event
from tests.torture.model import NS, Execution, Model

TERMINAL = ("succeeded", "dead", "cancelled", "skipped")
RATE_SLACK_SECONDS = 1.0  # a claim's recorded time may precede the count that admitted it
# The timeout counts from the claim, a moment before the handler's first line.
TIMEOUT_SLACK_SECONDS = 0.5
EPISODES_SHOWN = 3  # per subject; the rest are counted


@dataclass(frozen=True)
class Finding:
    """A guarantee broken (``excuse`` empty) or a documented exception met, with its evidence."""

    invariant: str
    subject: str  # "key race-…", "run 123", "job type capped"
    summary: str
    lines: tuple[Event, ...] = ()
    notes: tuple[str, ...] = ()  # what the final state (or a daemon's log) adds
    excuse: str = ""  # a documented exception: counted and shown, not a violation


def unique(lines: Iterable[Event | None]) -> tuple[Event, ...]:
    seen: dict[str, Event] = {}
    for e in lines:
        if e is not None:
            seen.setdefault(e.source or e.to_json(), e)
    return tuple(sorted(seen.values(), key=lambda e: e.t))


def attempts_of(model: Model, runs: Iterable[int]) -> tuple[str, ...]:
    """How the database recorded the runs' attempts (the observer's and the final state's)."""
    wanted = set(runs)
    out = []
    for a in model.attempts:
        if a["run"] in wanted:
            why = f" ({a['error_type']})" if a.get("error_type") else ""
            at = f" at {(a['finished'] - model.t0) / NS:+.3f}s" if a.get("finished") else ""
            out.append(
                f"recorded: run {a['run']} attempt {a['attempt']} {a['outcome']}{why}"
                f" by {a['worker']}{at}"
            )
    return tuple(out)


def trouble(model: Model, daemon: str, begin: int, end: int) -> str:
    """Why a daemon may have lost its leases between the times: a documented cause, or ""."""
    if model.frozen_between(daemon, begin, end) is not None:
        return "its daemon was frozen (SIGSTOP) past its lease"
    if model.outage_between(begin - model.lease_ns, end) is not None:
        return "the server was restarted: the holder could not renew its lease"
    # Renewals come every third of a lease: a starvation of two thirds of it can lose one.
    stall = model.stall_between(begin - model.lease_ns, end, model.lease_ns * 2 // 3)
    if stall is not None:
        if stall.get("paused"):
            return (
                f"the host was paused {stall.get('seconds')} s (a VM snapshot: the wall clock "
                "of the leases jumped on): no renewal in time"
            )
        return f"the host stalled {stall.get('seconds')} s (CPU starvation): no renewal in time"
    return ""


def lock_blamed(
    model: Model, runs: Iterable[int], daemons: Iterable[str], begin: int, end: int
) -> Event | None:
    """An operator's row lock, on one of ``runs`` or on any run one of ``daemons`` held, held
    for a whole lease within [begin, end]: what cost the lease then (never an excuse: a live
    holder keeps its lease whoever holds its row)."""
    wanted = set(runs)
    names = set(daemons)
    mine = [d for d in model.daemons.values() if d.name in names]
    for start, stop, line in model.row_locks:
        if line.get("run") not in wanted and not any(d.holds(line.get("holder")) for d in mine):
            continue
        if min(stop, end) - max(start, begin) >= model.lease_ns - NS:
            return line
    return None


def taken(model: Model, ex: Execution, before: int) -> tuple[str, Event | None]:
    """Whether ``ex``'s lease was taken (its attempt written lost: reaped, or a cancelled run
    let go of once its lease ended) before ``before`` for a documented reason: (the reason, or
    "" when it was not taken or nothing documented explains it; the row lock to blame, if one
    was held for a lease then). A slot or a run freed any other way (a timeout, a release,
    retention) has no excuse."""
    daemon = model.daemons.get(ex.daemon)
    if daemon is None:
        return "", None
    for a in model.attempts:
        if (
            a["run"] == ex.run
            and a["attempt"] == ex.attempt
            and daemon.holds(a["worker"])
            and 0 < int(a.get("finished") or 0) <= before
        ):
            previous = daemon.started.get("release") == "previous"
            stopping = daemon.termed is not None and daemon.termed.t <= int(a["finished"])
            let_go = a["outcome"] == "lost" and "cancel" in str(a.get("error"))
            if previous and stopping and (a["outcome"] == "released" or let_go):
                return PREVIOUS_RELEASED, None
            if previous and stopping and a.get("error_type") == "timeout":
                return PREVIOUS_TIMED_OUT, None
            if a["outcome"] == "lost":
                return lease_taken_by(model, ex.run, ex.daemon, int(a["finished"]))
    return "", None


# The previous release's shutdown gave back (or, cancelled, let go of) a run whose Python
# handler still ran (it ends with the process); this version does so only as the process ends
# (issue 43). Seen in the upgrade's rolling restart (CI seeds 82 and 659): the harness finds
# the bug in the release it upgrades from.
PREVIOUS_RELEASED = (
    "a daemon of the previous release: its shutdown let go of the run while the handler still"
    " ran (fixed in this version)"
)


# The previous release's shutdown wrote the timeout's failure of a handler that had not
# returned before its process ended, freeing its slot and letting its retry start elsewhere
# beside it (seed 4324, run 2997); this version writes it as the process's last act
# (`bec43ba`). Met in the upgrade's rolling restart (make test, seed 82, 2026-12-03).
PREVIOUS_TIMED_OUT = (
    "a daemon of the previous release: its shutdown wrote the timeout of a handler that had not"
    " returned (fixed in this version)"
)


# Before the first daemon of this version started, every reaper and heartbeat was the previous
# release's: a lease it took from a live holder is that release's known bug (a row lock's,
# a cancelled run's: docs/guarantees.md, "What it found"), fixed in this version.
PREVIOUS_TAKEN = (
    "taken while only daemons of the previous release ran (its known bugs, fixed in this version)"
)


def taken_not_before(model: Model, run: int, lease_end: int) -> int:
    """The earliest a reaper can have taken ``run`` whose lease ended at ``lease_end``: the
    reapers skip a row another session holds locked, so not before the end of the row locks
    on it that held from then, one after another (the attempt's end is written as the
    lease's, seconds earlier: seed 4324, run 722, taken after its holder had exited)."""
    taken = lease_end
    moved = True
    while moved:
        moved = False
        for start, stop, line in model.row_locks:
            if line.get("run") == run and start <= taken < stop:
                taken, moved = stop, True
    return taken


def lease_taken_by(model: Model, run: int, daemon: str, reaped: int) -> tuple[str, Event | None]:
    """Why ``daemon``'s lease on ``run`` was reaped at ``reaped``: a documented reason (frozen,
    cut off, starved) excuses it, whatever else happened (a fault that alone explains it must
    not turn into a violation once row locks are fixed); else the row lock held for a lease
    before on the run, or on another run of the daemon's (it stalled the heartbeat), is to
    blame, if there was one."""
    holder = model.daemons.get(daemon)
    if (
        holder is not None
        and holder.started.get("release") == "previous"
        and model.current_from is not None
        and reaped < model.current_from
    ):
        return PREVIOUS_TAKEN, None
    since = reaped - 2 * model.lease_ns
    # ``reaped`` is when the lease ended (the attempt's end as written). Under a row lock on
    # the run the reaper takes it only once the lock has gone, from a holder not alive then:
    # trouble up to the lock's end counts (seed 4324, run 3799: the lease ended under a lock
    # 0.6 s before a 12 s freeze of its holder, which the lock outlasted).
    taken = taken_not_before(model, run, reaped)
    until = reaped if taken == reaped else taken + 2 * NS
    reason = trouble(model, daemon, since, until)
    if reason:
        return reason, None
    return "", lock_blamed(model, [run], [daemon], since, reaped)


def by_run(executions: Iterable[Execution]) -> dict[int, list[Execution]]:
    out: dict[int, list[Execution]] = defaultdict(list)
    for ex in executions:
        out[ex.run].append(ex)
    for exs in out.values():
        exs.sort(key=lambda e: e.begin)
    return out
