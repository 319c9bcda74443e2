"""What a history says happened, as facts the checker reasons over: executions of handlers
(start, end, or the death of their process), committed and rolled-back enqueues, when each run
was seen to exist, daemons' lives, and the faults in force at each moment.

Times are ``time.time_ns()`` of the host every process ran on. Where an end is not known (a
command SIGKILLed mid-run), the last line the execution wrote is its end: an interval known to
be shorter than the truth, so an overlap the checker finds is real.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.torture.history import ATTEMPT_FIELDS, FAIL, INFO, INVOKE, OK, Event
from tests.torture.plan import World, seconds, world_from_json

NS = 1_000_000_000
FOREVER = 2**63
# How late the harness may learn of a daemon's exit (a thread waiting on it, on a loaded
# machine): an execution that died with its daemon surely ran until its exit less this.
DEATH_SLACK_NS = NS // 2


@dataclass
class Execution:
    """One call of a handler: a run's attempt on one process."""

    run: int
    attempt: int
    job_type: str
    behaviour: str
    process: str
    daemon: str  # the incarnation (d0#1)
    start: Event
    end: Event | None = None
    last: Event | None = None  # the last line it wrote (start, a tick or its end)
    died_at: int | None = None  # its process died first (a Python handler, with its daemon)

    @property
    def command(self) -> bool:
        return bool(self.start.get("command"))

    @property
    def begin(self) -> int:
        return self.start.t

    @property
    def finish(self) -> int:
        """When it ended: its end line, or its daemon's exit as the harness saw it (a Python
        handler dies with its process), or its last line (a command killed mid-run)."""
        if self.end is not None:
            return self.end.t
        if self.died_at is not None:
            return self.died_at
        return (self.last or self.start).t

    @property
    def surely_until(self) -> int:
        """A time it surely still ran at: its end, or its last line, or (died with its
        daemon) the daemon's exit as the harness saw it less the slack of seeing it. Overlaps
        are claimed on this, so that each one claimed is real."""
        if self.end is not None:
            return self.end.t
        last = (self.last or self.start).t
        if self.died_at is not None:
            return max(last, self.died_at - DEATH_SLACK_NS)
        return last

    @property
    def returned(self) -> bool:
        return self.end is not None and self.end.type == OK

    @property
    def key(self) -> str | None:
        value = self.start.get("ck")
        return str(value) if value is not None else None

    def events(self) -> list[Event]:
        return [e for e in (self.start, self.end) if e is not None]

    def describe(self) -> str:
        how = (
            "returned"
            if self.returned
            else "raised"
            if self.end
            else "died"
            if self.died_at
            else "open"
        )
        return f"run {self.run} attempt {self.attempt} on {self.daemon} ({self.behaviour}, {how})"


@dataclass
class Enqueue:
    """One client transaction and its answers."""

    process: str
    invoke: Event
    end: Event | None

    @property
    def outcome(self) -> str:
        return self.end.type if self.end is not None else INFO

    @property
    def committed(self) -> bool:
        return self.outcome == OK

    @property
    def answers(self) -> list[Mapping[str, Any]]:
        return list(self.end.get("answers", [])) if self.end is not None else []


@dataclass
class Sightings:
    """When one run was seen to exist, and what it was."""

    run: int
    times: list[int] = field(default_factory=list)
    states: list[tuple[int, list[Any], Event]] = field(default_factory=list)  # (t, row, line)
    gone: Event | None = None
    gone_state: list[Any] | None = None
    last_seen: int | None = None  # before it was found gone

    def statuses(self) -> set[str]:
        out = {str(row[1]) for _, row, _ in self.states}
        if self.gone_state is not None:
            out.add(str(self.gone_state[1]))
        return out


@dataclass
class Daemon:
    name: str
    pid: int
    started: Event
    ready: Event | None = None
    exit: Event | None = None
    killed: Event | None = None
    termed: Event | None = None  # the harness's SIGTERM (a nemesis's, or the final stop)
    # worker.processes above 1: when each worker process ended (pid -> ns), as logged
    worker_exits: dict[int, int] = field(default_factory=dict)
    # ... and by worker id (the holder a run's attempt names)
    worker_id_exits: dict[str, int] = field(default_factory=dict)

    @property
    def worker_id(self) -> str:
        return str(self.ready.get("worker_id", "")) if self.ready else ""

    def holds(self, worker: str | None) -> bool:
        """Whether ``worker`` (a worker id) is this daemon's: its own, or with
        ``worker.processes`` above 1 one of its worker processes' ("host:PID.SLOT:suffix",
        PID its supervisor's, the process the harness started)."""
        if not worker:
            return False
        if worker == self.worker_id:
            return True
        parts = worker.rsplit(":", 2)
        return len(parts) == 3 and parts[1].partition(".")[0] == str(self.pid) and "." in parts[1]

    @property
    def died_at(self) -> int | None:
        times = [e.t for e in (self.killed, self.exit) if e is not None]
        return min(times) if times else None


@dataclass
class Model:
    world: World
    lease_ns: int
    t0: int
    end: int  # when the harness stopped the daemons (the final state is read after)
    events: list[Event]
    executions: list[Execution]
    enqueues: list[Enqueue]
    sightings: dict[int, Sightings]
    daemons: dict[str, Daemon]
    frozen: dict[str, list[tuple[int, int, Event]]]  # daemon -> (from, to, the freeze line)
    outages: list[tuple[int, int, Event]]  # the server down: (from, to, line)
    stalls: list[tuple[int, int, Event]]  # the harness starved of CPU: (from, to, line)
    row_locks: list[tuple[int, int, Event]]  # an operator's row lock held: (from, to, line)
    operations: list[Event]  # cancel, retry, prune, faults: every other line, for context
    final: Mapping[str, Any]
    retention_ns: int  # an ended attempt's row is kept at least this long
    attempts: list[Mapping[str, Any]]  # every ended attempt seen: by the observer, or at the end
    # Until when a daemon of the previous release may have run (the rolling restart after the
    # migrate fault ended; the end of the run if it never did), None: no upgrade in this run.
    old_until: int | None = None
    # When the first daemon of this version started in an upgrade run (None: no upgrade):
    # before it, every reaper and heartbeat was the previous release's.
    current_from: int | None = None
    processes: int = 1  # each daemon's worker.processes

    def daemon_of(self, worker: str | None) -> Daemon | None:
        """The daemon that ``worker`` (a worker id) belongs to, if one of this run's."""
        return next((d for d in self.daemons.values() if d.holds(worker)), None)

    def final_runs(self) -> dict[int, Mapping[str, Any]]:
        return {int(r["id"]): r for r in self.final.get("runs", [])}

    def frozen_between(self, daemon: str, begin: int, end: int) -> Event | None:
        for start, stop, line in self.frozen.get(daemon, []):
            if start <= end and stop >= begin:
                return line
        return None

    def outage_between(self, begin: int, end: int) -> Event | None:
        for start, stop, line in self.outages:
            if start <= end and stop >= begin:
                return line
        return None

    def stall_between(self, begin: int, end: int, at_least: int) -> Event | None:
        for start, stop, line in self.stalls:
            if stop - start >= at_least and start <= end and stop >= begin:
                return line
        return None

    def context(
        self, runs: Iterable[int], begin: int, end: int, daemons: Iterable[str] = ()
    ) -> list[Event]:
        """The operator's and the nemesis's lines between the times that name one of ``runs``
        or ``daemons``; and, in force during the last two leases before ``end`` (what could
        have cost a lease then), the row locks on other runs those daemons held, the server's
        restarts and the sessions it ended."""
        wanted, names = set(runs), set(daemons)
        mine = [d for d in self.daemons.values() if d.name in names]
        recent = end - 2 * self.lease_ns
        locks = {
            line.get("step")
            for start, stop, line in self.row_locks
            if any(d.holds(line.get("holder")) for d in mine) and start <= end and stop >= recent
        }
        return [
            e
            for e in self.operations
            if begin <= e.t <= end
            and (
                e.get("run") in wanted
                or e.get("daemon") in names
                or (e.f == "row-lock" and e.get("step") in locks)
                or (e.f in ("pg-restart", "terminate-backend") and e.t >= recent)
            )
        ]


def build(raw_plan: Mapping[str, Any], events: Sequence[Event], final: Mapping[str, Any]) -> Model:
    world = world_from_json(raw_plan["world"])
    t0 = next((e.t for e in events if e.f == "start"), events[0].t if events else 0)
    end = next(
        (e.t for e in events if e.f == "stop" and e.type == INVOKE), events[-1].t if events else 0
    )
    daemons = read_daemons(events)
    return Model(
        world=world,
        lease_ns=int(world.lease_seconds * NS),
        t0=t0,
        end=end,
        events=list(events),
        executions=read_executions(events, daemons),
        enqueues=read_enqueues(events),
        sightings=read_sightings(events),
        daemons=daemons,
        frozen=read_intervals(events, "freeze", by="daemon"),
        outages=read_intervals(events, "pg-restart", by=None).get("", []),
        row_locks=clipped(
            read_intervals(events, "row-lock", by=None).get("", []),
            read_intervals(events, "pg-restart", by=None).get("", []),
        ),
        stalls=[
            (e.t - int(float(e.get("seconds", 0)) * NS), e.t, e) for e in events if e.f == "stall"
        ],
        operations=[
            e
            for e in events
            if e.f
            not in ("handler", "enqueue", "observe", "effect", "daemon", "daemon-exit", "stall")
        ],
        final=final,
        retention_ns=int(attempt_retention(world) * NS),
        attempts=read_attempts(events, final),
        old_until=read_old_until(events, end),
        current_from=read_current_from(events, end),
        processes=int(next((e.get("processes", 1) for e in events if e.f == "start"), 1)),
    )


def read_current_from(events: Sequence[Event], end: int) -> int | None:
    """When the first daemon of this version started, in a run that began on the previous
    release (None: not such a run)."""
    if not any(e.f == "migrate" for e in events):
        return None
    return next(
        (
            e.t
            for e in events
            if e.f == "daemon" and e.type == INVOKE and e.get("release") == "current"
        ),
        end,
    )


def read_old_until(events: Sequence[Event], end: int) -> int | None:
    """When the last daemon of the previous release stopped (the rolling restart's end)."""
    if not any(e.f == "migrate" for e in events):
        return None
    return next((e.t for e in events if e.f == "upgrade" and e.type == OK), end)


def attempt_retention(world: World) -> float:
    """How long an ended attempt's row is kept at least: a succeeded one with the succeeded
    runs, the others with the longest retention (concepts.md, "Where a run's rows go")."""
    kept = [seconds(v) for v in world.retention.values()]
    return min(seconds(world.retention["succeeded"]), max(kept))


def read_attempts(events: Sequence[Event], final: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ended attempts the observer saw, and those of the final state, once each."""
    out: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for e in events:
        if e.f == "observe":
            for row in e.get("attempts", []):
                out.setdefault(tuple(row), dict(zip(ATTEMPT_FIELDS, row, strict=True)))
    for a in final.get("attempts", []):
        if a.get("outcome") is not None:
            out.setdefault(tuple(a.get(k) for k in ATTEMPT_FIELDS), a)
    return sorted(out.values(), key=lambda a: (a["run"], a["attempt"], a.get("finished") or 0))


def read_daemons(events: Sequence[Event]) -> dict[str, Daemon]:
    out: dict[str, Daemon] = {}
    for e in events:
        name = str(e.get("daemon", ""))
        if e.f == "daemon" and e.type == INVOKE:
            out[name] = Daemon(name, int(e.get("pid", 0)), e)
        elif name in out and e.f == "daemon" and e.type == OK:
            out[name].ready = e
        elif name in out and e.f == "daemon-exit":
            out[name].exit = e
        elif name in out and e.f == "worker-exit":
            out[name].worker_exits[int(e.get("pid", 0))] = int(e.get("at", 0))
            if e.get("worker_id"):
                out[name].worker_id_exits[str(e.get("worker_id"))] = int(e.get("at", 0))
        elif name in out and e.f == "kill" and e.type == OK:
            out[name].killed = e
        elif name in out and e.f == "term" and e.type == INVOKE:
            out[name].termed = out[name].termed or e
        elif e.f == "stop" and e.type == INVOKE:
            for each in e.get("daemons", []):
                if each in out:
                    out[each].termed = out[each].termed or e
    return out


def read_executions(events: Sequence[Event], daemons: Mapping[str, Daemon]) -> list[Execution]:
    out: list[Execution] = []
    open_: dict[tuple[str, int, int], list[Execution]] = defaultdict(list)
    for e in events:
        if e.f != "handler":
            continue
        key = (e.process, int(e.get("run", 0)), int(e.get("attempt", 0)))
        if e.type == INVOKE:
            daemon = str(e.get("daemon") or "")
            ex = Execution(
                key[1],
                key[2],
                str(e.get("job_type")),
                str(e.get("b")),
                e.process,
                daemon,
                e,
                last=e,
            )
            open_[key].append(ex)
            out.append(ex)
        elif open_[key]:
            ex = open_[key][0]
            ex.last = e
            if e.type in (OK, FAIL):
                ex.end = e
                open_[key].pop(0)
    for ex in out:
        if ex.end is None and not ex.command:
            holder = daemons.get(ex.daemon)
            if holder is None:
                continue
            # Its own process's end (a worker process), else its daemon's.
            ended = holder.worker_exits.get(int(ex.start.get("pid", 0)), holder.died_at)
            if ended is not None and ended >= ex.begin:
                ex.died_at = ended
    return out


def read_enqueues(events: Sequence[Event]) -> list[Enqueue]:
    started: dict[str, Enqueue] = {}
    out: list[Enqueue] = []
    for e in events:
        if e.f != "enqueue":
            continue
        if e.type == INVOKE:
            started[e.process] = Enqueue(e.process, e, None)
            out.append(started[e.process])
        elif e.process in started:
            started.pop(e.process).end = e
    return out


def read_sightings(events: Sequence[Event]) -> dict[int, Sightings]:
    out: dict[int, Sightings] = {}

    def of(run: int) -> Sightings:
        return out.setdefault(run, Sightings(run))

    for e in events:
        if e.f == "observe":
            for row in e.get("runs", []):
                s = of(int(row[0]))
                s.times.append(e.t)
                s.states.append((e.t, row, e))
            for row in e.get("gone", []):
                s = of(int(row[0]))
                s.gone, s.gone_state = e, row
                s.last_seen = int(row[-1]) if len(row) > 6 else None
                if s.last_seen is not None:
                    s.times.append(s.last_seen)
        elif e.f == "handler" and e.get("run") is not None:
            of(int(e.get("run"))).times.append(e.t)
    return out


def clipped(
    locks: Sequence[tuple[int, int, Event]], outages: Sequence[tuple[int, int, Event]]
) -> list[tuple[int, int, Event]]:
    """Row locks end at the latest when the server goes down (its sessions end with it), not
    when the harness noticed its transaction was gone."""
    out = []
    for start, stop, line in locks:
        ends = [o for o, _, _ in outages if start <= o < stop]
        out.append((start, min([stop, *ends]), line))
    return out


def read_intervals(
    events: Sequence[Event], f: str, by: str | None
) -> dict[str, list[tuple[int, int, Event]]]:
    """invoke..ok pairs of ``f`` (grouped by the value ``by``): the fault's time in force."""
    opened: dict[Any, Event] = {}
    out: dict[str, list[tuple[int, int, Event]]] = defaultdict(list)
    for e in events:
        if e.f != f:
            continue
        group = str(e.get(by, "")) if by else ""
        ident = (group, e.get("step"))
        if e.type == INVOKE:
            opened[ident] = e
        elif ident in opened:
            begin = opened.pop(ident)
            out[group].append((begin.t, e.t, begin))
    for (group, _), begin in opened.items():  # never ended: in force to the end
        out[group].append((begin.t, FOREVER, begin))
    return out
