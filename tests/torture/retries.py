"""Guarantees 4, 5 and 6: nothing committed is lost (kills, restarts, retention), nothing rolled
back exists; a handler that returned normally is recorded succeeded; a transactional effect
is committed exactly once per succeeded run."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from tests.torture.findings import (
    TERMINAL,
    TIMEOUT_SLACK_SECONDS,
    Finding,
    attempts_of,
    taken,
    unique,
)
from tests.torture.history import FAIL
from tests.torture.model import NS, Execution, Model

TX = ("tx", "txflaky")  # the behaviours that commit their success in ctx.transaction()

# -- 4 nothing lost -------------------------------------------------------------------------------


def no_loss(model: Model) -> list[Finding]:
    """Every committed enqueue's run ends terminal or is still queued/pending at the stop;
    none vanishes before it ended (kills, restarts, retention); none of a rolled-back one."""
    final = model.final_runs()
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
                why = "never seen at all" if s is None else "never seen ended"
                if s is not None and s.gone_state is not None:
                    why = f"removed while {s.gone_state[1]}"
                out.append(
                    Finding(
                        "no-loss",
                        f"run {run}",
                        f"committed, then lost: {why}, and not in the final state",
                        unique([enq.invoke, enq.end, s.gone if s else None]),
                    )
                )
            elif enq.outcome == FAIL and _exists(model, run, answer.get("n"), s):
                out.append(
                    Finding(
                        "no-loss",
                        f"run {run}",
                        f"enqueued by a transaction that did not commit"
                        f" ({enq.end.get('outcome') if enq.end else '?'}), yet it exists",
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


def _exists(model: Model, run: int, n: Any, s: Any) -> bool:
    """Whether the run a rolled-back enqueue was answered exists: by its id and its payload's
    ``n``, where the final state or a handler shows it. After a crash PostgreSQL may hand an
    uncommitted transaction's sequence values out again, so another enqueue's run can carry the
    id (seed 4324: id 1585 ran as ``n`` 1297.0.0, not the rolled-back 1289.0)."""
    final = model.final_runs().get(run)
    ns = {final.get("n")} if final is not None else set()
    ns |= {e.start.get("n") for e in model.executions if e.run == run}
    ns.discard(None)
    if ns and n is not None:
        return n in ns
    executed = any(e.run == run for e in model.executions)
    return final is not None or executed or bool(s and s.states)


# -- 5 a success is recorded as a success --------------------------------------------------------


def success_recorded(model: Model) -> list[Finding]:
    """A handler that returned normally has its attempt recorded succeeded, unless its run was
    cancelled, or it returned after its timeout (the late result is ignored: documented)."""
    rows: dict[tuple[int, int], list[Mapping[str, Any]]] = defaultdict(list)
    for a in model.attempts:
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


def only_successes_recorded(model: Model) -> list[Finding]:
    """Conversely, an attempt recorded succeeded had a handler that returned normally: that
    attempt, on that daemon (no result of another claim landed on it)."""
    out = []
    for row in model.attempts:
        daemon = model.daemon_of(row["worker"])
        if row["outcome"] != "succeeded" or daemon is None:
            continue
        mine = [
            e
            for e in model.executions
            if e.run == row["run"] and e.attempt == row["attempt"] and e.daemon == daemon.name
        ]
        # A transaction's commit is the success: a kill before its end line leaves none.
        if any(e.returned or (e.behaviour in TX and e.end is None) for e in mine):
            continue
        what = "its handler raised" if mine else "no handler ran it there"
        out.append(
            Finding(
                "success-recorded",
                f"run {row['run']}",
                f"attempt {row['attempt']} recorded succeeded by {daemon.name}, but {what}",
                unique(
                    line for e in model.executions if e.run == row["run"] for line in e.events()
                ),
                attempts_of(model, [row["run"]]),
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
    mine = [
        r
        for r in rows.get((ex.run, ex.attempt), [])
        if daemon is None or not daemon.ready or daemon.holds(r["worker"])
    ]
    if any(r["outcome"] == "succeeded" for r in mine):
        return None
    job_type = model.world.job_type(ex.job_type)
    timeout = job_type.timeout if job_type else None
    late = "it returned after its timeout: the late result is ignored"
    if timeout is None or ex.finish - ex.begin < (timeout - TIMEOUT_SLACK_SECONDS) * NS:
        late = ""
    if mine:
        r = mine[-1]
        why = r.get("error_type") or r.get("error") or "-"
        what = f"attempt recorded {r['outcome'] or 'open'} ({why})"
        if r["outcome"] == "lost" and "cancel" in str(r.get("error")):
            return what, "its run was cancelled while it ran"
        if r["outcome"] == "released" and daemon and daemon.termed and daemon.termed.t < ex.finish:
            return what, "it returned after its daemon's SIGTERM: released at the shutdown"
        if r["outcome"] == "lost" and r.get("error_type") == "lease_expired":
            died = daemon.died_at if daemon else None
            if died is not None and ex.begin <= died <= ex.finish + model.lease_ns + 5 * NS:
                return what, "its daemon died before the result was written"
            return what, late or taken(model, ex, int(r.get("finished") or 0))[0]
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
    tx_runs = {e.run for e in model.executions if e.behaviour in TX}
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
