"""The checker: one function per guarantee of docs/guarantees.md, over a history and the final
state of the database. It knows the promises, not the implementation (no pgtick import).

Each function returns findings: a violation names the guarantee, the run, key or job type, and
the smallest slice of history that shows it (the lines, by file and line number, and what the
final state adds); an excused finding is a documented exception (a daemon frozen past its
lease, an outage of the server, an operator's cancel), counted and shown, never dropped.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.torture.history import FAIL, INVOKE, OK, Event
from tests.torture.model import NS, Enqueue, Execution, Model, build

TERMINAL = ("succeeded", "dead", "cancelled", "skipped")
RATE_SLACK_SECONDS = 1.0  # a claim's recorded time may precede the count that admitted it
# The timeout counts from the claim, a moment before the handler's first line.
TIMEOUT_SLACK_SECONDS = 0.5
EPISODES_SHOWN = 3  # per subject; the rest are counted
# Numbered as the issue lists them; held-run-kept is rule 11's "retention never removes a
# held run", checked apart from the limit it breaks.
INVARIANTS = {
    "idempotency": 1,
    "single-execution": 2,
    "lease-kept": 2,
    "limits": 3,
    "held-run-kept": 3,
    "no-loss": 4,
    "success-recorded": 5,
    "effects-once": 6,
    "schedule-once": 7,
    "daemon-lifecycle": 8,
}


@dataclass(frozen=True)
class Finding:
    invariant: str
    subject: str  # "key race-…", "run 123", "job type capped"
    summary: str
    lines: tuple[Event, ...] = ()
    notes: tuple[str, ...] = ()  # what the final state (or a daemon's log) adds
    excuse: str = ""  # a documented exception: counted and shown, not a violation


@dataclass
class Verdict:
    seed: int
    t0: int
    violations: list[Finding]
    excused: list[Finding]
    counts: dict[str, Counter[str]] = field(default_factory=dict)


def check(
    raw_plan: Mapping[str, Any], events: Sequence[Event], final: Mapping[str, Any]
) -> Verdict:
    model = build(raw_plan, events, final)
    findings: list[Finding] = []
    for invariant in CHECKS:
        findings.extend(invariant(model))
    return Verdict(
        seed=int(raw_plan.get("seed", 0)),
        t0=model.t0,
        violations=[f for f in findings if not f.excuse],
        excused=[f for f in findings if f.excuse],
        counts=summary(model, findings),
    )


def unique(lines: Iterable[Event | None]) -> tuple[Event, ...]:
    seen: dict[str, Event] = {}
    for e in lines:
        if e is not None:
            seen.setdefault(e.source or e.to_json(), e)
    return tuple(sorted(seen.values(), key=lambda e: e.t))


def attempts_of(model: Model, runs: Iterable[int]) -> tuple[str, ...]:
    wanted = set(runs)
    return tuple(
        f"final: run {a['run']} attempt {a['attempt']} {a['outcome'] or 'open'}"
        f"{' (' + a['error_type'] + ')' if a.get('error_type') else ''} by {a['worker']}"
        for a in model.final.get("attempts", [])
        if a["run"] in wanted
    )


def trouble(model: Model, daemon: str, begin: int, end: int) -> str:
    """Why a daemon may have lost its leases between the times: a documented cause, or ""."""
    if model.frozen_between(daemon, begin, end) is not None:
        return "its daemon was frozen (SIGSTOP) past its lease"
    if model.outage_between(begin - model.lease_ns, end) is not None:
        return "the server was restarted: the holder could not renew its lease"
    # Renewals come every third of a lease: a starvation of two thirds of it can lose one.
    stall = model.stall_between(begin - model.lease_ns, end, model.lease_ns * 2 // 3)
    if stall is not None:
        return f"the host stalled {stall.get('seconds')} s (CPU starvation): no renewal in time"
    return ""


def row_locked(lines: Iterable[Event]) -> bool:
    """An operator's transaction held one of the runs' rows: never an excuse (SPEC rule 11)."""
    return any(e.f == "row-lock" for e in lines)


# -- 1 idempotency ---------------------------------------------------------------------------------


def idempotency(model: Model) -> list[Finding]:
    """At most one run per idempotency key while that run exists, whatever the isolation level
    of the enqueuing transaction; the ids returned for a key's enqueues are the same."""
    runs_of: dict[str, set[int]] = defaultdict(set)
    seen: dict[int, list[tuple[int, Event | None]]] = defaultdict(list)
    creator: dict[int, Enqueue] = {}
    for enq in model.enqueues:
        if not enq.committed or enq.end is None:
            continue
        for answer in enq.answers:
            if answer.get("key") is None:
                continue
            runs_of[answer["key"]].add(answer["id"])
            seen[answer["id"]].append((enq.end.t, enq.end))
            if answer.get("created"):
                creator[answer["id"]] = enq
    for run, s in model.sightings.items():
        for t, row, line in s.states:
            if row[5] is not None:
                runs_of[row[5]].add(run)
                seen[run].append((t, line))
        if s.gone_state is not None and s.gone_state[5] is not None and s.last_seen:
            seen[run].append((s.last_seen, s.gone))
    for (
        ex
    ) in model.executions:  # claimed, so it existed (its end proves nothing: see held-run-kept)
        if ex.run in seen:
            seen[ex.run].append((ex.begin, ex.start))
    final = model.final_runs()
    for run, row in final.items():
        if row.get("key"):
            runs_of[row["key"]].add(run)
            seen[run].append((model.end, None))
    out = []
    for key, runs in sorted(runs_of.items()):
        spans = {
            r: (min(t for t, _ in seen[r]), max(t for t, _ in seen[r])) for r in runs if seen[r]
        }
        ordered = sorted(spans, key=lambda r: spans[r][0])
        for i, a in enumerate(ordered):
            clash = next((b for b in ordered[i + 1 :] if spans[b][0] <= spans[a][1]), None)
            if clash is None:
                continue
            out.append(two_runs_for_a_key(model, key, a, clash, creator, seen, final))
            break
    return out


def two_runs_for_a_key(
    model: Model,
    key: str,
    a: int,
    b: int,
    creator: Mapping[int, Enqueue],
    seen: Mapping[int, list[tuple[int, Event | None]]],
    final: Mapping[int, Mapping[str, Any]],
) -> Finding:
    lines: list[Event | None] = []
    levels = []
    for run in (a, b):
        enq = creator.get(run)
        if enq is not None:
            lines += [enq.invoke, enq.end]
            levels.append(f"{run} by a {enq.invoke.get('isolation')} transaction")
        else:
            levels.append(f"{run}")
    # The last sight of the first run that is not before the second one existed.
    b_from = min(t for t, _ in seen[b])
    lines.append(
        next(
            (line for t, line in sorted(seen[a], key=lambda p: p[0]) if t >= b_from and line), None
        )
    )
    notes = (
        [f"final: runs {a} and {b} both exist with key {key}"] if a in final and b in final else []
    )
    return Finding(
        "idempotency",
        f"key {key}",
        f"two runs for one key at once: {' and '.join(levels)}",
        unique(lines),
        tuple(notes),
    )


# -- 2 single execution ------------------------------------------------------------------------


def by_run(executions: Iterable[Execution]) -> dict[int, list[Execution]]:
    out: dict[int, list[Execution]] = defaultdict(list)
    for ex in executions:
        out[ex.run].append(ex)
    for exs in out.values():
        exs.sort(key=lambda e: e.begin)
    return out


def single_execution(model: Model) -> list[Finding]:
    """No two executions of one run overlap in time (a daemon frozen past its lease, and the
    server restarted under a holder, excepted and counted)."""
    out = []
    for run, exs in sorted(by_run(model.executions).items()):
        pairs = [(a, b) for i, a in enumerate(exs) for b in exs[i + 1 :] if b.begin < a.finish]
        if not pairs:
            continue
        a, b = pairs[0]
        context = model.context([run], a.begin - model.lease_ns - 10 * NS, b.begin, [a.daemon])
        excuse = "" if row_locked(context) else trouble(model, a.daemon, a.begin, b.begin)
        more = f" ({len(pairs) - 1} more overlapping pairs)" if len(pairs) > 1 else ""
        out.append(
            Finding(
                "single-execution",
                f"run {run}",
                f"two executions at once: {a.describe()} and {b.describe()}, overlapping"
                f" {(min(a.finish, b.finish) - b.begin) / NS:.1f} s{more}",
                unique([*a.events(), *b.events(), *context]),
                attempts_of(model, [run]),
                excuse,
            )
        )
    return out


def lease_kept(model: Model) -> list[Finding]:
    """A lease is taken (the attempt written lost, lease_expired) only from a holder that
    could not renew it: dead, frozen, cut off from the server, starved. Never from a live one
    because another session held the run's row."""
    by_worker = {d.worker_id: d for d in model.daemons.values() if d.worker_id}
    out = []
    for row in model.final.get("attempts", []):
        if row.get("error_type") != "lease_expired" or not row.get("finished"):
            continue
        reaped = int(row["finished"])
        daemon = by_worker.get(row["worker"])
        if daemon is None:
            continue  # not a daemon of this run's (a leftover of a fixture): nothing to say
        if daemon.died_at is not None and daemon.died_at <= reaped:
            continue  # a crash: what leases are for
        mine = [
            e
            for e in model.executions
            if e.run == row["run"] and e.attempt == row["attempt"] and e.daemon == daemon.name
        ]
        since = reaped - 2 * model.lease_ns
        context = model.context([row["run"]], since - 10 * NS, reaped, [daemon.name])
        excuse = "" if row_locked(context) else trouble(model, daemon.name, since, reaped)
        if not excuse and daemon.termed is not None and daemon.termed.t <= reaped:
            excuse = "its daemon was stopping (SIGTERM): a result it could not write is reaped"
        out.append(
            Finding(
                "lease-kept",
                f"run {row['run']}",
                f"attempt {row['attempt']} taken from {daemon.name}, alive (lease expired and"
                f" reaped at {(reaped - model.t0) / NS:+.1f}s)",
                unique([*(line for e in mine for line in e.events()), *context]),
                attempts_of(model, [row["run"]]),
                excuse,
            )
        )
    return out


# -- 3 limits --------------------------------------------------------------------------------------


def over_limit(executions: Sequence[Execution], limit: int) -> list[tuple[int, list[Execution]]]:
    """The moments a start made more than ``limit`` executions run at once, with them."""
    out = []
    for ex in sorted(executions, key=lambda e: e.begin):
        active = [o for o in executions if o.begin <= ex.begin < o.finish]
        if len(active) > limit:
            active.sort(key=lambda o: (o is not ex, o.begin))
            out.append((ex.begin, active[: limit + 1]))
    return out


def limit_findings(
    model: Model, subject: str, limit_name: str, limit: int, executions: Sequence[Execution]
) -> list[Finding]:
    out: list[Finding] = []
    shown: set[frozenset[tuple[int, int, str]]] = set()
    moments = over_limit(executions, limit)
    for t, group in moments:
        ident = frozenset((e.run, e.attempt, e.process) for e in group)
        if ident in shown:
            continue
        shown.add(ident)
        if len(shown) > EPISODES_SHOWN:
            break
        runs = sorted({e.run for e in group})
        context = model.context(runs, min(e.begin for e in group) - 70 * NS, t)
        excuse = next((x for e in group if (x := trouble(model, e.daemon, e.begin, t))), "")
        excuse = "" if row_locked(context) else excuse
        out.append(
            Finding(
                "limits",
                subject,
                f"{len(group)} handlers at once with {limit_name} = {limit}: "
                + "; ".join(e.describe() for e in group)
                + (f" ({len(moments)} such starts in all)" if len(moments) > 1 else ""),
                unique([*(line for e in group for line in e.events()), *context]),
                attempts_of(model, runs),
                excuse,
            )
        )
    return out


def rate_findings(
    model: Model, subject: str, limit: tuple[int, float], executions: Sequence[Execution]
) -> list[Finding]:
    count, window = limit
    claims = sorted(
        (
            (float(e.start.get("claimed")), e)
            for e in executions
            if e.start.get("claimed") is not None
        ),
        key=lambda p: p[0],
    )
    out = []
    for i, (at, _) in enumerate(claims):
        inside = [e for c, e in claims[i:] if c < at + window - RATE_SLACK_SECONDS]
        if len(inside) > count:
            out.append(
                Finding(
                    "limits",
                    subject,
                    f"{len(inside)} starts within {window - RATE_SLACK_SECONDS:g} s with rate"
                    f" {count}/{window:g} s (claim times, database clock)",
                    unique(e.start for e in inside),
                )
            )
            break
    return out


def limits(model: Model) -> list[Finding]:
    """Never more handlers of a job type at once than its max_running, per key than its
    max_running_per_key, nor more starts in a window than its rate: from the handlers' own
    start and end lines, not from the table."""
    out: list[Finding] = []
    for jt in model.world.job_types:
        mine = [e for e in model.executions if e.job_type == jt.name]
        if jt.max_running is not None:
            out += limit_findings(model, f"job type {jt.name}", "max_running", jt.max_running, mine)
        if jt.max_running_per_key is not None:
            keys: dict[str, list[Execution]] = defaultdict(list)
            for e in mine:
                if e.key is not None:
                    keys[e.key].append(e)
            for key, group in sorted(keys.items()):
                out += limit_findings(
                    model,
                    f"job type {jt.name} key {key}",
                    "max_running_per_key",
                    jt.max_running_per_key,
                    group,
                )
        if jt.rate_limit is not None:
            out += rate_findings(model, f"job type {jt.name}", jt.rate_limit, mine)
    return out


def holder_dead(model: Model, ex: Execution, at: int) -> bool:
    """A command outlives its daemon: its run is no longer held once the daemon is gone."""
    daemon = model.daemons.get(ex.daemon)
    died = daemon.died_at if daemon is not None else None
    return died is not None and died < at


def held_run_kept(model: Model) -> list[Finding]:
    """Retention and prune never remove a run that is held (its handler still running)."""
    out = []
    runs = by_run(model.executions)
    for run, s in sorted(model.sightings.items()):
        if s.gone is None or s.gone_state is None or s.gone_state[3] is None or not s.last_seen:
            continue
        alive = [
            e
            for e in runs.get(run, [])
            if e.begin < s.gone.t < e.finish and not holder_dead(model, e, s.gone.t)
        ]
        if not alive:
            continue
        held = next(
            (line for t, row, line in s.states if row[3] is not None and row[1] in TERMINAL), None
        )
        context = model.context([run], alive[0].begin, s.gone.t)
        prunes = [
            e
            for e in model.operations
            if e.f == "prune" and s.last_seen - 70 * NS <= e.t <= s.gone.t
        ]
        out.append(
            Finding(
                "held-run-kept",
                f"run {run}",
                f"removed while held ({s.gone_state[1]}, holder {s.gone_state[3]}) and its handler"
                f" still running: {alive[0].describe()}",
                unique([alive[0].start, held, *context, *prunes, s.gone]),
            )
        )
    return out


# -- 4 nothing lost ---------------------------------------------------------------------------------


def no_loss(model: Model) -> list[Finding]:
    """Every committed enqueue's run ends terminal or is still queued/pending at the stop;
    none vanishes before it ended (kills, restarts, retention); none of a rolled-back one."""
    final = model.final_runs()
    executed = {e.run for e in model.executions}
    out = []
    for enq in model.enqueues:
        for answer in enq.answers:
            if not answer.get("created"):
                continue
            run = int(answer["id"])
            s = model.sightings.get(run)
            if enq.committed:
                if run in final or (s is not None and s.statuses() & set(TERMINAL)):
                    continue
                why = (
                    f"removed while {s.gone_state[1]}" if s and s.gone_state else "never seen ended"
                )
                out.append(
                    Finding(
                        "no-loss",
                        f"run {run}",
                        f"committed, then lost: {why}, and not in the final state",
                        unique([enq.invoke, enq.end, s.gone if s else None]),
                    )
                )
            elif enq.outcome == FAIL and (run in final or run in executed or (s and s.states)):
                out.append(
                    Finding(
                        "no-loss",
                        f"run {run}",
                        f"enqueued by a transaction that did not commit ({enq.end.get('outcome') if enq.end else '?'}),"
                        " yet it exists",
                        unique(
                            [
                                enq.invoke,
                                enq.end,
                                *(e.start for e in model.executions if e.run == run),
                            ]
                        ),
                    )
                )
    return out


# -- 5 a success is recorded as a success --------------------------------------------------------


def success_recorded(model: Model) -> list[Finding]:
    """A handler that returned normally has its attempt recorded succeeded, unless its run was
    cancelled, or it returned after its timeout (the late result is ignored: documented)."""
    rows: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for a in model.final.get("attempts", []):
        rows[(a["run"], a["attempt"])].append(a)
    out = []
    for ex in model.executions:
        found = recorded_as(model, ex, rows) if ex.returned else None
        if found is None:
            continue
        what, excuse = found
        out.append(
            Finding(
                "success-recorded",
                f"run {ex.run}",
                f"{ex.describe()}: returned normally, {what}",
                unique(
                    [
                        *ex.events(),
                        *model.context([ex.run], ex.begin - 10 * NS, ex.finish + 10 * NS),
                    ]
                ),
                attempts_of(model, [ex.run]),
                excuse,
            )
        )
    return out


def recorded_as(
    model: Model, ex: Execution, rows: Mapping[tuple[int, int], list[Mapping[str, Any]]]
) -> tuple[str, str] | None:
    """(what was recorded instead of a success, its documented excuse or "") for a handler
    that returned normally; None when it was recorded succeeded, or nothing is left to tell
    (its run and attempt removed by retention)."""
    daemon = model.daemons.get(ex.daemon)
    worker = daemon.worker_id if daemon else ""
    mine = [r for r in rows.get((ex.run, ex.attempt), []) if not worker or r["worker"] == worker]
    if any(r["outcome"] == "succeeded" for r in mine):
        return None
    job_type = model.world.job_type(ex.job_type)
    timeout = job_type.timeout if job_type else None
    late = "it returned after its timeout: the late result is ignored"
    if timeout is None or ex.finish - ex.begin < (timeout - TIMEOUT_SLACK_SECONDS) * NS:
        late = ""
    if mine:
        r = mine[-1]
        what = f"attempt recorded {r['outcome'] or 'open'} ({r.get('error_type') or r.get('error') or '-'})"
        if r["outcome"] == "lost" and "cancel" in str(r.get("error")):
            return what, "its run was cancelled while it ran"
        if r["outcome"] == "released" and daemon and daemon.termed and daemon.termed.t < ex.finish:
            return what, "it returned after its daemon's SIGTERM: released at the shutdown"
        if r["outcome"] == "lost" and r.get("error_type") == "lease_expired":
            died = daemon.died_at if daemon else None
            if died is not None and ex.finish <= died <= ex.finish + model.lease_ns + 5 * NS:
                return what, "its daemon died before the result was written"
            return what, late or trouble(model, ex.daemon, ex.begin, ex.finish + 2 * NS)
        return what, late
    status = model.final_runs().get(ex.run, {}).get("status")
    seen = model.sightings[ex.run].statuses() if ex.run in model.sightings else set()
    if status == "succeeded" or "succeeded" in seen:
        return None
    if status == "cancelled" or "cancelled" in seen:
        return "its run cancelled", "its run was cancelled while it ran"
    if status is None or ex.finish < model.end - model.retention_ns:
        return None  # its attempt's row (and maybe its run) is past retention: nothing to compare
    return f"no attempt of it recorded, run {status}", late


# -- 6 transactional effects exactly once -------------------------------------------------------


def effects_once(model: Model) -> list[Finding]:
    """A run that commits its success with ctx.transaction() has its effect row exactly once
    if it succeeded, and none if it did not."""
    rows: Counter[int] = Counter()
    for e in model.final.get("effects", []):
        rows[int(e["run"])] += int(e["rows"])
    final = model.final_runs()
    tx_runs = {e.run for e in model.executions if e.behaviour in ("tx", "txflaky")}
    out = []
    for run in sorted(tx_runs | set(rows)):
        seen = model.sightings[run].statuses() if run in model.sightings else set()
        status = final.get(run, {}).get("status")
        succeeded = status == "succeeded" or "succeeded" in seen
        lines = unique(
            [*(x for e in model.executions if e.run == run for x in e.events()),
             *(e for e in model.events if e.f == "effect" and e.get("run") == run)]
        )  # fmt: skip
        problem = ""
        if rows[run] > 1:
            problem = f"its effect committed {rows[run]} times"
        elif succeeded and rows[run] == 0:
            problem = "succeeded without its effect row"
        elif rows[run] and status is not None and status != "succeeded" and not succeeded:
            problem = f"its effect row committed, but the run is {status}"
        if problem:
            out.append(
                Finding("effects-once", f"run {run}", problem, lines, attempts_of(model, [run]))
            )
    return out


# -- 7 one run per schedule occurrence ------------------------------------------------------------


def schedule_once(model: Model) -> list[Finding]:
    """One run per schedule occurrence; a skip schedule never runs two of its runs at once
    (a cancelled run's handler, an operator's retry excepted)."""
    out = []
    occurrences: dict[tuple[str, str], set[int]] = defaultdict(set)
    for ex in model.executions:
        if ex.start.get("sched"):
            occurrences[(str(ex.start.get("sched")), str(ex.start.get("scheduled_for")))].add(
                ex.run
            )
    for row in model.final.get("runs", []):
        if row.get("schedule") and row.get("scheduled_for"):
            occurrences[(row["schedule"], "final " + row["scheduled_for"])].add(int(row["id"]))
    for (name, occurrence), runs in sorted(occurrences.items()):
        if len(runs) > 1:
            lines = unique(e.start for e in model.executions if e.run in runs)
            out.append(
                Finding(
                    "schedule-once",
                    f"schedule {name}",
                    f"{len(runs)} runs for occurrence {occurrence}: {sorted(runs)}",
                    lines,
                )
            )
    final = model.final_runs()
    retried = {int(e.get("run")) for e in model.operations if e.f == "retry" and e.type == OK}
    for s in model.world.schedules:
        if s.overlap != "skip":
            continue
        mine = sorted(
            (e for e in model.executions if e.start.get("sched") == s.name), key=lambda e: e.begin
        )
        for i, a in enumerate(mine):
            b = next((b for b in mine[i + 1 :] if b.run != a.run and b.begin < a.finish), None)
            if b is None:
                continue
            cancelled = any(
                final.get(r, {}).get("status") == "cancelled"
                or (r in model.sightings and "cancelled" in model.sightings[r].statuses())
                for r in (a.run, b.run)
            )
            excuse = (
                "an operator cancelled one of them"
                if cancelled
                else "an operator retried one of them"
                if {a.run, b.run} & retried
                else trouble(model, a.daemon, a.begin, b.begin)
            )
            out.append(
                Finding(
                    "schedule-once",
                    f"schedule {s.name}",
                    f"overlap = skip, yet two of its runs at once: {a.describe()} and {b.describe()}",
                    unique([*a.events(), *b.events()]),
                    attempts_of(model, [a.run, b.run]),
                    excuse,
                )
            )
            break
    return out


# -- 8 daemons stop only when told, and leave nothing running -------------------------------------


def daemon_lifecycle(model: Model) -> list[Finding]:
    """No daemon exits unless told to; SIGTERM ends it with 0 (1 only when results could not be
    written, documented); after the stop no run is running, no worker row of a daemon that
    stopped cleanly is left, and no handler process is alive."""
    out = []
    for d in model.daemons.values():
        e = d.exit
        if e is None:
            continue
        tail = tuple(f"log: {line[:300]}" for line in e.get("log_tail", []))
        code, told = e.get("code"), e.get("told")
        if not told:
            if not e.get("started"):
                excuse = (
                    "it could not start while the server was down"
                    if model.outage_between(d.started.t - 10 * NS, e.t) or code == 3
                    else ""
                )
                out.append(
                    Finding(
                        "daemon-lifecycle",
                        f"daemon {d.name}",
                        f"failed to start (exit {code})",
                        (d.started, e),
                        tail,
                        excuse,
                    )
                )
            else:
                out.append(
                    Finding(
                        "daemon-lifecycle",
                        f"daemon {d.name}",
                        f"exited {code} unprompted",
                        (d.started, e),
                        tail,
                    )
                )
        elif told == "SIGTERM" and code != 0:
            excuse = (
                "exit 1: results not written in time (documented)"
                if code == 1
                and any("results_not_written" in line for line in e.get("log_tail", []))
                else ""
            )
            out.append(
                Finding(
                    "daemon-lifecycle",
                    f"daemon {d.name}",
                    f"exited {code} after SIGTERM",
                    (d.started, e),
                    tail,
                    excuse,
                )
            )
    for e in model.events:
        if e.f == "stop-timeout":
            out.append(
                Finding(
                    "daemon-lifecycle",
                    f"daemon {e.get('daemon')}",
                    "did not stop within the stop timeout of SIGTERM",
                    (e,),
                )
            )
    clean = {
        d.worker_id
        for d in model.daemons.values()
        if d.exit is not None and d.exit.get("told") == "SIGTERM" and d.exit.get("code") == 0
    }
    for run in model.final.get("runs", []):
        if run["status"] == "running":
            out.append(
                Finding(
                    "daemon-lifecycle",
                    f"run {run['id']}",
                    f"left running after the stop (held by {run['locked_by']})",
                    (),
                    attempts_of(model, [run["id"]]),
                )  # fmt: skip
            )
    for worker in model.final.get("workers", []):
        if worker in clean:
            out.append(
                Finding(
                    "daemon-lifecycle", f"worker {worker}", "its workers row outlived a clean stop"
                )
            )
    for pid in model.final.get("leftover_processes", []):
        out.append(
            Finding(
                "daemon-lifecycle",
                f"process {pid}",
                "a command handler still alive after every daemon stopped",
            )
        )
    return out


CHECKS: tuple[Callable[[Model], list[Finding]], ...] = (
    idempotency,
    single_execution,
    lease_kept,
    limits,
    held_run_kept,
    no_loss,
    success_recorded,
    effects_once,
    schedule_once,
    daemon_lifecycle,
)


# -- what was exercised ---------------------------------------------------------------------------


def summary(model: Model, findings: Sequence[Finding]) -> dict[str, Counter[str]]:
    """Counts of each operation, fault and behaviour exercised, and of the final states."""
    ops: Counter[str] = Counter()
    for enq in model.enqueues:
        outcome = enq.end.get("outcome", "unknown") if enq.end else "unfinished"
        ops[f"enqueue {outcome}"] += 1
        ops[f"enqueue at {enq.invoke.get('isolation')}"] += 1
        ops[f"enqueue via {enq.invoke.get('api')}"] += 1
        if enq.invoke.get("race") is not None:
            ops["enqueue in a key race"] += 1
        ops["runs created"] += sum(1 for a in enq.answers if a.get("created") and enq.committed)
        ops["runs keyed"] += sum(1 for a in enq.answers if a.get("key") and enq.committed)
    faults: Counter[str] = Counter()
    for e in model.operations:
        if e.f in ("cancel", "retry", "prune"):
            if e.type != INVOKE:
                ops[f"{e.f} {'skipped' if e.get('skipped') else 'exit ' + str(e.get('exit'))}"] += 1
        elif e.f in (
            "kill",
            "term",
            "freeze",
            "terminate-backend",
            "pg-restart",
            "row-lock",
            "held-snapshot",
            "migrate",
        ):
            if e.get("skipped"):
                faults[f"{e.f} skipped"] += 1
            elif (e.f == "kill" and e.type == OK) or (e.f != "kill" and e.type == INVOKE):
                faults[e.f] += 1
            elif e.type == FAIL:
                faults[f"{e.f} failed"] += 1
    handlers: Counter[str] = Counter()
    for ex in model.executions:
        handlers[ex.behaviour] += 1
        end = (
            "returned"
            if ex.returned
            else "raised"
            if ex.end
            else "died with its daemon"
            if ex.died_at
            else "no end"
        )
        handlers[f"-> {end}"] += 1
    final: Counter[str] = Counter(r["status"] for r in model.final.get("runs", []))
    pending: Counter[str] = Counter()
    for r in model.final.get("runs", []):
        if r["status"] in ("queued", "failed"):
            why = "not due yet" if r.get("future") else "due at the stop (backlog)"
            pending[f"{r['status']} {r['job_type']}: {why}"] += 1
    daemons: Counter[str] = Counter()
    for d in model.daemons.values():
        daemons["started"] += 1
        if d.exit is not None:
            daemons[f"exit {d.exit.get('code')} after {d.exit.get('told') or 'nothing'}"] += 1
    excused: Counter[str] = Counter(f"{f.invariant}: {f.excuse}" for f in findings if f.excuse)
    return {
        "operations": ops,
        "faults": faults,
        "handlers": handlers,
        "daemons": daemons,
        "final runs": final,
        "pending at the stop": pending,
        "excused": excused,
    }
