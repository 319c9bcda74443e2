"""The plan of a torture run, drawn from one seed: pure data, no I/O.

A plan is the world (the job types and their limits, the schedules, retention, the daemons'
settings) and the steps: each an operation (a client's enqueue, an operator's cancel) or a
fault (a daemon frozen, a row held locked), at a time in seconds after the start, with every
choice already made. Each kind of step draws from a stream of its own
(``random.Random(f"{seed}/{kind}")``), so ``--only`` keeps the steps of the kinds it keeps
exactly as the full plan has them. What a step meets when it runs (which run is running when a
cancel arrives) is up to the system under test: a plan replays, a history need not.

The weights below are tuned so that a run of a few minutes on the 2-core test machine meets
each class of bug the review found (docs/guarantees.md names the seeds).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# -- The world ---------------------------------------------------------------------------------

LEASE_SECONDS = 6.0  # short, for the row-lock and freeze faults to outlast it within seconds;
# not shorter: a daemon starved of CPU on a busy 2-core machine must still renew it
REAPER_SECONDS = 1.0  # recovery within a lease and a second
POLL_SECONDS = 1.0
GRACE_SECONDS = 2.0  # a SIGTERM's drain stays short: the plan restarts the daemon after it
THREADS = 4
TICK_SECONDS = 15.0  # the ticker (skip schedules wake at their occurrences anyway)
# Retention short enough to drop partitions while runs are in flight: a period is never under
# a minute (partition_period), and any retention under 4 minutes has one-minute periods. The
# cancelled runs' is the least the config takes (any duration above 0), so that a cancelled
# run's partition drops at the first pass after its minute ends.
RETENTIONS = ("1m", "1m", "2m")
CANCELLED_RETENTION = "1s"
HOT_KEYS = 6  # the pool of idempotency keys plain enqueues reuse
CONCURRENCY_KEYS = ("a", "b", "c")

# Handler behaviours: what a handler does, and the range of seconds it takes.
#   ok        waits its seconds on ctx.cancelled (stops with an error if set), returns
#   long      the same, longer than a lease and a held row lock together
#   fail      raises ValueError every attempt (dead once attempts run out)
#   flaky     raises on the first attempt, returns on later ones
#   raise     raises RuntimeError;  exit: sys.exit(3);  failhard: raises pgtick.Fail
#   retry     raises pgtick.Retry(after=1) on the first attempt, returns later
#   overrun   sleeps past the job type's timeout without looking at ctx.cancelled
#   ignore    sleeps without looking at ctx.cancelled (a cancel or a shutdown does not stop it)
#   linger    the same, longer than a lease and a held row lock together
#   stubborn  the same for minutes: outlives a cancel and a minute-long retention
#   tx        commits its effect row and its success in ctx.transaction()
#   txflaky   the same, but the first attempt raises inside the transaction (rolled back)
#   cmd_ok / cmd_fail / cmd_ignore_term: the command handler exits 0 / 1 / ignores SIGTERM
BEHAVIOURS: dict[str, tuple[float, float]] = {
    "ok": (0.05, 1.5),
    "long": (15.0, 35.0),
    "fail": (0.05, 0.5),
    "flaky": (0.05, 0.5),
    "raise": (0.05, 0.3),
    "exit": (0.05, 0.3),
    "failhard": (0.05, 0.3),
    "retry": (0.05, 0.3),
    "overrun": (4.0, 8.0),
    "ignore": (3.0, 12.0),
    "linger": (20.0, 60.0),
    "stubborn": (150.0, 240.0),
    "tx": (0.05, 0.8),
    "txflaky": (0.05, 0.8),
    "cmd_ok": (0.1, 2.0),
    "cmd_fail": (0.1, 1.0),
    "cmd_ignore_term": (3.0, 10.0),
}


@dataclass(frozen=True)
class JobType:
    """One job type of the world: its limits and the behaviours its runs are drawn from."""

    name: str
    behaviours: tuple[tuple[str, int], ...]
    weight: int  # share of the enqueued runs
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: str | None = None  # "N/minute"
    timeout: float | None = None
    command: bool = False
    max_attempts: int = 3

    @property
    def rate_limit(self) -> tuple[int, float] | None:
        """(N, window seconds) of ``rate``."""
        if self.rate is None:
            return None
        count, _, unit = self.rate.partition("/")
        return int(count), {"second": 1.0, "minute": 60.0, "hour": 3600.0}[unit]

    @property
    def keyed(self) -> bool:
        return self.max_running_per_key is not None


JOB_TYPES: tuple[JobType, ...] = (
    JobType(
        "free",
        (
            ("ok", 40),
            ("long", 10),
            ("fail", 5),
            ("flaky", 6),
            ("raise", 3),
            ("exit", 3),
            ("failhard", 2),
            ("retry", 3),
            ("ignore", 5),
            ("tx", 6),
        ),
        weight=30,
    ),
    JobType(
        "capped", (("ok", 5), ("overrun", 3), ("fail", 1)), weight=10, max_running=1, timeout=2.0
    ),
    JobType("pair", (("ok", 6), ("overrun", 2), ("tx", 2)), weight=8, max_running=2, timeout=3.0),
    JobType(
        "keyed",
        (("ok", 6), ("long", 2), ("flaky", 1)),
        weight=10,
        max_running=3,
        max_running_per_key=1,
    ),
    JobType("rated", (("ok", 1),), weight=6, rate="12/minute"),
    JobType("stubborn", (("stubborn", 1),), weight=3, max_running=1),
    JobType("slow", (("linger", 1),), weight=3),
    JobType("tx", (("tx", 4), ("txflaky", 2)), weight=8),
    JobType(
        "cmd",
        (("cmd_ok", 5), ("cmd_fail", 1), ("cmd_ignore_term", 2)),
        weight=6,
        command=True,
        timeout=20.0,
    ),
    # Chains and batches (docs/composition.md): their runs only; weight 0, so plain enqueues
    # draw the other types exactly as before.
    JobType("comp", (("ok", 6), ("flaky", 2), ("fail", 1), ("failhard", 1)), weight=0),
)
SCHEDULED_TYPE = JobType("sched", (("ok", 1),), weight=0)


@dataclass(frozen=True)
class Schedule:
    name: str
    cron: str
    overlap: str
    catchup: str
    seconds: float  # how long each of its runs' handlers takes


@dataclass(frozen=True)
class World:
    """What every daemon's config says, and what the checker judges against."""

    job_types: tuple[JobType, ...]
    schedules: tuple[Schedule, ...]
    retention: Mapping[str, str]
    lease_seconds: float = LEASE_SECONDS
    reaper_seconds: float = REAPER_SECONDS
    grace_seconds: float = GRACE_SECONDS
    threads: int = THREADS
    prefetch: int = 0

    def job_type(self, name: str) -> JobType | None:
        for t in (*self.job_types, SCHEDULED_TYPE):
            if t.name == name:
                return t
        return None


# -- The steps ---------------------------------------------------------------------------------

# Operations and faults: events per minute of the run, for three daemons (faults that target
# a daemon scale with the count). The `migrate` fault is not a rate: a run starts on the
# previous release and is upgraded once, or not at all (UPGRADE_SHARE; tests/torture/upgrade.py).
OPERATIONS: dict[str, float] = {
    "enqueue": 90.0,
    "key-race": 10.0,
    "cancel": 8.0,
    "retry": 5.0,
    "prune": 0.8,
    # An operator's runtime controls (docs/operations/runtime.md): a job type paused for a few
    # seconds, then resumed; a limited type's max_running changed or reset to the config's.
    "pause": 2.5,
    "limits": 1.5,
    # Composition (docs/composition.md): a run with on_success/on_dead steps (some nested);
    # a batch of `comp` runs with a callback, members added later, closed now or later.
    "chain": 4.0,
    "batch": 2.0,
}
COMP_TYPE = "comp"
COMP_SECONDS = (0.05, 1.5)
PAUSED_TYPES = ("free", "keyed", "capped", "tx")
PAUSE_SECONDS = (2.0, 12.0)
# Only types limited in the config: a runtime limit on an unlimited one would hold its backlog
# past the quiet end of the run (no-loss), and it is the same check.
LIVE_LIMITED_TYPES = ("capped", "pair", "keyed")
LIVE_MAX_RUNNING = (1, 1, 2, 3, 4, None)  # None: --reset, back to the config's
FAULTS: dict[str, float] = {
    "kill": 0.4,
    "term": 0.4,
    "freeze": 0.6,
    "terminate-backend": 1.5,
    "pg-restart": 0.35,
    "row-lock": 4.0,
    "held-snapshot": 1.0,
}
# The share of plans that start on the previous release and run the migrate fault once, in the
# first half of the active time (a rolling restart follows it, under the other faults).
UPGRADE_SHARE = 0.5
ONCE = ("migrate",)
PER_DAEMON = ("kill", "term", "freeze")
KINDS = (*OPERATIONS, *FAULTS, *ONCE)
ISOLATIONS = (("read committed", 4), ("repeatable read", 3), ("serializable", 2))
SETTLE_SECONDS = 8.0  # no fault before the daemons have settled
MIN_QUIESCE_SECONDS = 40.0  # faults over, no new work: time for leases and retries to end


@dataclass(frozen=True)
class Step:
    at: float
    kind: str
    args: Mapping[str, Any]


@dataclass(frozen=True)
class Plan:
    seed: int
    minutes: float
    daemons: int
    only: tuple[str, ...]
    world: World
    steps: tuple[Step, ...]
    active_seconds: float  # operations and faults happen before this
    quiesce_seconds: float
    faults: float = 1.0  # every fault's rate times this (--faults; long runs)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for step in self.steps:
            out[step.kind] = out.get(step.kind, 0) + 1
        return out

    @property
    def upgrade(self) -> bool:
        """The run starts on the previous release and is upgraded (the migrate fault)."""
        return any(step.kind == "migrate" for step in self.steps)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def world_from_json(raw: Mapping[str, Any]) -> World:
    """A World written by ``Plan.to_json`` (the checker reads the plan back)."""
    return World(
        job_types=tuple(
            JobType(**{**t, "behaviours": tuple(tuple(b) for b in t["behaviours"])})
            for t in raw["job_types"]
        ),
        schedules=tuple(Schedule(**s) for s in raw["schedules"]),
        retention=dict(raw["retention"]),
        lease_seconds=raw["lease_seconds"],
        reaper_seconds=raw["reaper_seconds"],
        grace_seconds=raw["grace_seconds"],
        threads=raw["threads"],
        prefetch=raw["prefetch"],
    )


def seconds(duration: str) -> float:
    """A retention of the world ("90s", "2m", "1h") in seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    return float(duration[:-1]) * units[duration[-1]]


class PlanError(ValueError):
    """Arguments no plan can be drawn from (a usage error)."""


def draw(
    seed: int, minutes: float, daemons: int, only: Sequence[str] = (), faults: float = 1.0
) -> Plan:
    """The plan of ``seed``: the same arguments give the same plan. ``faults`` multiplies
    every fault's rate (a 30-minute run draws each fault 20 times or more at 3; the CI seeds
    run at 1); operations keep theirs."""
    unknown = sorted(set(only) - set(KINDS))
    if unknown:
        raise PlanError(f"--only: unknown kind {', '.join(unknown)}; kinds: {', '.join(KINDS)}")
    if only and not any(OPERATIONS.get(k) or FAULTS.get(k) or k in ONCE for k in only):
        raise PlanError(f"--only {','.join(only)}: not built in this version (weight 0)")
    if daemons < 1:
        raise PlanError("--daemons must be at least 1")
    if not 0 < faults <= 10:
        raise PlanError(f"--faults {faults:g}: a multiplier of the fault rates above 0, at most 10")
    total = minutes * 60.0
    quiesce = max(MIN_QUIESCE_SECONDS, total * 0.25)
    active = total - quiesce
    if active < SETTLE_SECONDS * 2:
        raise PlanError(f"--minutes {minutes:g}: too short, at least {2 * (quiesce + 16) / 120:g}")
    world = draw_world(random.Random(f"{seed}/world"))
    steps: list[Step] = []
    for kind, per_minute in (*OPERATIONS.items(), *FAULTS.items()):
        if only and kind not in only:
            continue
        rate = per_minute * (daemons / 3 if kind in PER_DAEMON else 1.0) / 60.0
        rate *= faults if kind in FAULTS else 1.0
        if rate <= 0:
            continue
        rng = random.Random(f"{seed}/{kind}")
        start = SETTLE_SECONDS if kind in FAULTS else 1.0
        at = start + rng.expovariate(rate)
        while at < active:
            steps.append(Step(round(at, 3), kind, draw_args(kind, rng, world, daemons)))
            at += rng.expovariate(rate)
    rng = random.Random(f"{seed}/migrate")
    upgrade = rng.random() < UPGRADE_SHARE
    if "migrate" in only or (upgrade and not only):
        at = rng.uniform(SETTLE_SECONDS + 5.0, max(SETTLE_SECONDS + 6.0, active / 2))
        steps.append(Step(round(at, 3), "migrate", {}))
    steps.sort(key=lambda s: (s.at, s.kind))
    return Plan(seed, minutes, daemons, tuple(only), world, tuple(steps), active, quiesce, faults)


def draw_world(rng: random.Random) -> World:
    schedules = (
        Schedule("every_minute_skip", "* * * * *", "skip", "latest", rng.uniform(50, 80)),
        Schedule("every_minute_allow", "* * * * *", "allow", "none", rng.uniform(60, 90)),
        Schedule("quick_skip", "* * * * *", "skip", rng.choice(("all", "latest")), 1.0),
    )
    retention = {s: rng.choice(RETENTIONS) for s in ("succeeded", "dead", "skipped")}
    # The least the config takes: a cancelled run's one-minute partition drops at the first
    # pass after the minute ends, under a handler that ignores the cancel.
    retention["cancelled"] = CANCELLED_RETENTION
    return World(JOB_TYPES, schedules, retention, prefetch=rng.choice((0, 0, 2)))


def weighted(rng: random.Random, pairs: Sequence[tuple[Any, int]]) -> Any:
    return rng.choices([p[0] for p in pairs], weights=[p[1] for p in pairs])[0]


def draw_run(rng: random.Random, world: World, key: str | None = None) -> dict[str, Any]:
    """One run to enqueue: its job type, behaviour and the arguments enqueue gets."""
    job_type: JobType = weighted(rng, [(t, t.weight) for t in world.job_types])
    behaviour = weighted(rng, job_type.behaviours)
    low, high = BEHAVIOURS[behaviour]
    run: dict[str, Any] = {
        "job_type": job_type.name,
        "b": behaviour,
        "s": round(rng.uniform(low, high), 3),
        "key": key,
        "priority": rng.choice((None, None, None, 0, 5, -5)),
        "in": rng.choice((0.0, 0.0, 0.0, 0.0, round(rng.uniform(0.5, 8.0), 1))),
    }
    if job_type.keyed:
        run["ck"] = rng.choice(CONCURRENCY_KEYS)
        run["ck_arg"] = rng.random() < 0.5  # also given as enqueue's concurrency_key
    return run


def comp_run(rng: random.Random, world: World) -> dict[str, Any]:
    """A run of a chain or a batch: its behaviour and seconds (the `comp` job type)."""
    job_type = world.job_type(COMP_TYPE)
    behaviours = job_type.behaviours if job_type is not None else (("ok", 1),)
    return {"b": weighted(rng, behaviours), "s": round(rng.uniform(*COMP_SECONDS), 3)}


def comp_step(rng: random.Random, world: World, depth: int) -> dict[str, Any]:
    """A chain step: a `comp` run, with a nested step of its own now and then."""
    step: dict[str, Any] = comp_run(rng, world)
    if depth < 3 and rng.random() < 0.35:
        step["on_success"] = [comp_step(rng, world, depth + 1)]
    if depth < 3 and rng.random() < 0.15:
        step["on_dead"] = [comp_step(rng, world, depth + 1)]
    return step


def draw_transaction(
    rng: random.Random, world: World, keys: Sequence[str | None]
) -> dict[str, Any]:
    """One client transaction: isolation, API, pauses, its runs, commit or rollback."""
    return {
        "isolation": weighted(rng, ISOLATIONS),
        "api": rng.choice(("sql", "python")),
        "early_snapshot": rng.random() < 0.4,  # a read before the enqueue takes the snapshot
        "pause_before": round(rng.uniform(0, 0.3), 3),
        "pause_after": round(rng.uniform(0, 0.3), 3),
        "rollback": rng.random() < 0.12,
        "runs": [draw_run(rng, world, key) for key in keys],
    }


def draw_args(kind: str, rng: random.Random, world: World, daemons: int) -> dict[str, Any]:
    """Every choice a step of ``kind`` makes, drawn from its kind's stream."""
    if kind in OPERATIONS:
        return operation_args(kind, rng, world)
    return fault_args(kind, rng, world, daemons)


def operation_args(kind: str, rng: random.Random, world: World) -> dict[str, Any]:
    if kind == "enqueue":
        count = rng.choice((1, 1, 1, 2, 3))
        keys = [
            f"hot-{rng.randrange(HOT_KEYS)}" if rng.random() < 0.25 else None for _ in range(count)
        ]
        return draw_transaction(rng, world, keys)
    if kind == "key-race":
        # Two to four transactions at once on one key nobody has used: a double submit.
        key = f"race-{rng.getrandbits(40):010x}"
        return {
            "transactions": [
                draw_transaction(rng, world, [key]) for _ in range(rng.choice((2, 2, 3, 4)))
            ]
        }
    if kind == "cancel":
        return {
            "status": weighted(rng, (("running", 6), ("queued", 2), ("failed", 1))),
            # handlers that ignore the cancel: their runs stay held while retention runs
            "job_type": rng.choice(
                (None, "stubborn", "stubborn", "stubborn", "slow", "slow", "free", "cmd", "keyed")
            ),
            "pick": rng.random(),
        }
    if kind == "retry":
        return {
            "status": weighted(rng, (("cancelled", 3), ("dead", 2), ("failed", 1))),
            "job_type": None,
            "pick": rng.random(),
        }
    if kind == "prune":
        return {"older_than": rng.choice((None, "1m"))}
    if kind == "pause":
        return {
            "job_type": rng.choice(PAUSED_TYPES),
            "seconds": round(rng.uniform(*PAUSE_SECONDS), 1),
        }
    if kind == "limits":
        return {
            "job_type": rng.choice(LIVE_LIMITED_TYPES),
            "max_running": rng.choice(LIVE_MAX_RUNNING),
        }
    if kind == "chain":
        return {
            "api": rng.choice(("sql", "python")),
            "root": comp_run(rng, world),
            "on_success": [comp_step(rng, world, 1) for _ in range(rng.choice((1, 1, 2)))],
            "on_dead": [comp_step(rng, world, 1) for _ in range(rng.choice((0, 1)))],
        }
    if kind == "batch":
        return {
            "members": [comp_run(rng, world) for _ in range(rng.randint(2, 12))],
            "later": [comp_run(rng, world) for _ in range(rng.choice((0, 0, 1, 3)))],
            "close_after": rng.choice((0.0, 0.0, round(rng.uniform(0.5, 6.0), 1))),
        }
    raise PlanError(f"no arguments for {kind}")


def fault_args(kind: str, rng: random.Random, world: World, daemons: int) -> dict[str, Any]:
    if kind in ("kill", "term"):
        return {"daemon": rng.randrange(daemons), "restart_after": round(rng.uniform(1.0, 8.0), 1)}
    if kind == "freeze":
        return {
            "daemon": rng.randrange(daemons),
            "seconds": round(world.lease_seconds + rng.uniform(1.0, 6.0), 1),
        }
    if kind == "terminate-backend":
        return {"count": rng.choice((1, 1, 2, 3)), "pick": rng.random()}
    if kind == "pg-restart":
        return {
            "mode": rng.choice(("fast", "fast", "immediate")),
            "down": round(rng.uniform(0.2, 2.5), 1),
        }
    if kind == "row-lock":
        return {
            # Past the lease, and most often not by more than the reaper's look back (5 s): a
            # lease that ended longer before the lock was let go is renewed, not reaped.
            "seconds": round(world.lease_seconds + rng.uniform(1.5, 6.0), 1),
            # Among the running runs of the type (any type if none), newest first: a handler that
            # ignores cancels with most of its time ahead, so a second copy overlaps it for long.
            "pick": rng.random() * 0.5,
            "job_type": rng.choice((None, "slow", "slow")),
            "commit": rng.random() < 0.5,
        }
    if kind == "held-snapshot":
        return {"seconds": round(rng.uniform(5.0, 30.0), 1)}
    if kind == "migrate":
        return {}
    raise PlanError(f"no arguments for {kind}")
