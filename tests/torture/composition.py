"""Guarantees 16 and 17 (docs/guarantees.md, docs/composition.md): each chain step is enqueued
exactly once, by the outcome it names; each batch's callback is enqueued exactly once, with
the right counts, when the batch is closed and every member has ended.

The runs of chains and batches carry tags (payload ``n``): a chain's root ``cS``, its steps
``cS.s0``, ``cS.d0``, ``cS.s0.s0`` ...; a batch's members ``bS.m0`` ... and its callback
``bS.cb``. The client's answer says, per tag, the tags of each outcome's steps. A run of a tag
is known from its handler's start line (history survives retention) or the final state, so a
tag with two runs is a step enqueued twice, whenever it happened.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from tests.torture.findings import TERMINAL, Finding, unique
from tests.torture.history import OK, Event
from tests.torture.model import NS, Model

OUTCOME_STATUS = {"on_success": "succeeded", "on_dead": "dead"}


def _runs_by_tag(model: Model) -> dict[str, set[int]]:
    out: dict[str, set[int]] = defaultdict(set)
    for row in model.final.get("runs", []):
        if row.get("n"):
            out[str(row["n"])].add(int(row["id"]))
    for ex in model.executions:
        tag = ex.start.get("n")
        if tag:
            out[str(tag)].add(ex.run)
    return out


def _statuses(model: Model, run: int) -> set[str]:
    """Every status the run was seen in: the observer's samples and the final state."""
    seen = model.sightings.get(run)
    out = set(seen.statuses()) if seen is not None else set()
    final = model.final_runs().get(run)
    if final is not None:
        out.add(str(final["status"]))
    return out


def _operator_lines(model: Model, verbs: tuple[str, ...]) -> list[Event]:
    return [e for e in model.operations if e.f in verbs and e.type == OK]


def chain_once(model: Model) -> list[Finding]:
    """Each step of a committed chain has at most one run, and exactly one once the run
    before it ended with the step's outcome (a step of an outcome never reached: none)."""
    answers = [e for e in model.operations if e.f == "chain" and e.type == OK]
    if not answers:
        return []
    by_tag = _runs_by_tag(model)
    final = model.final_runs()
    retried = {int(e.get("run")) for e in _operator_lines(model, ("retry",)) if e.get("run")}
    removals = [e for e in _operator_lines(model, ("cancel", "prune"))]
    out = []
    for answer in answers:
        specs: Mapping[str, Mapping[str, list[str]]] = answer.get("specs", {})
        for parent, outcomes in specs.items():
            parents = by_tag.get(parent, set())
            for outcome, children in outcomes.items():
                status = OUTCOME_STATUS[outcome]
                for child in children:
                    runs = by_tag.get(child, set())
                    subject = f"chain step {child}"
                    if len(runs) > 1:
                        again = _enqueued_again(model, sorted(runs), parents & retried)
                        out.append(
                            Finding(
                                "chain-once",
                                subject,
                                f"enqueued {len(runs)} times (runs {sorted(runs)}) after run(s)"
                                f" {sorted(parents)} ended {status}",
                                unique([answer, *again]),
                                excuse="its run was retried by an operator and ended so again"
                                " after retention removed the step's earlier run (documented:"
                                " docs/composition.md, Exactly once)"
                                if again
                                else "",
                            )
                        )
                        continue
                    ended_so = [p for p in parents if status in _statuses(model, p)]
                    if runs and not ended_so and not parents & retried:
                        out.append(
                            Finding(
                                "chain-once",
                                subject,
                                f"run {min(runs)} enqueued, but run(s) {sorted(parents)} of"
                                f" {parent} were never seen {status}",
                                unique([answer]),
                            )
                        )
                    ended_finally = [p for p in parents if final.get(p, {}).get("status") == status]
                    if not runs and ended_finally:
                        p = ended_finally[0]
                        finished = float(final[p].get("finished") or 0) * NS
                        later = [e for e in removals if e.t >= finished - NS]
                        out.append(
                            Finding(
                                "chain-once",
                                subject,
                                f"never enqueued, though run {p} of {parent} ended {status}",
                                unique([answer, *later[:2]]),
                                excuse="an operator's cancel or prune since may have removed it"
                                " before it ran (cancelled runs are kept 1 s)"
                                if later
                                else "",
                            )
                        )
    return out


def _enqueued_again(model: Model, runs: list[int], retried: set[int]) -> list[Event]:
    """The lines that show a step's second run to be the documented one: the run before it
    retried by an operator (``pgtick retry`` of a dead run) and each earlier run of the step
    seen gone (retention) before the next was seen; empty when that is not so. A step's run
    has the idempotency key ``pgtick.chain.<run>.<outcome>.<step>``, which holds only while
    the run it names is kept."""
    if not retried:
        return []
    lines = [e for e in _operator_lines(model, ("retry",)) if e.get("run") in retried]
    for earlier, later in itertools.pairwise(runs):
        gone = model.sightings.get(earlier)
        seen = model.sightings.get(later)
        if gone is None or gone.gone is None or seen is None or not seen.times:
            return []
        if gone.gone.t > min(seen.times):
            return []
        lines.append(gone.gone)
    return lines


def batch_callback_once(model: Model) -> list[Finding]:
    """A batch's callback is enqueued at most once; with the counts of its members'
    outcomes; and it is enqueued once the batch is closed and every member has ended."""
    by_tag = _runs_by_tag(model)
    final = model.final_runs()
    batches = {int(b["id"]): b for b in model.final.get("batches", [])}
    touched = {
        int(e.get("run")) for e in _operator_lines(model, ("retry", "cancel")) if e.get("run")
    }
    adds: dict[int, list[int]] = defaultdict(list)
    for e in model.operations:
        if e.f == "batch-add" and e.type == OK:
            adds[int(e.get("batch"))] += [int(m) for m in e.get("members", [])]
    out = []
    for opened in (e for e in model.operations if e.f == "batch-open" and e.type == OK):
        batch_id, tag = int(opened.get("batch")), str(opened.get("tag"))
        members = [int(m) for m in opened.get("members", [])] + adds[batch_id]
        subject = f"batch {batch_id}"
        callbacks = by_tag.get(f"{tag}.cb", set())
        if len(callbacks) > 1:
            out.append(
                Finding(
                    "batch-callback-once",
                    subject,
                    f"callback enqueued {len(callbacks)} times: runs {sorted(callbacks)}",
                    unique([opened]),
                )
            )
        got = _callback_counts(model, callbacks)
        if got is not None:
            out += _check_counts(subject, opened, got, members, final, touched)
        row = batches.get(batch_id)
        if not callbacks and row is not None and row["state"] == "closed":
            ended = int(row["succeeded"]) + int(row["dead"]) + int(row["cancelled"])
            if ended >= int(row["members"]):
                out.append(
                    Finding(
                        "batch-callback-once",
                        subject,
                        f"closed, {ended} of {row['members']} members ended, and no callback",
                        unique([opened]),
                    )
                )
        elif not callbacks and row is not None and row["state"] == "done":
            out.append(
                Finding(
                    "batch-callback-once",
                    subject,
                    "done, yet no run of its callback was ever seen",
                    unique([opened]),
                )
            )
    return out


def _callback_counts(model: Model, callbacks: set[int]) -> Mapping[str, Any] | None:
    for row in model.final.get("runs", []):
        if int(row["id"]) in callbacks and row.get("batch"):
            return dict(row["batch"])
    for ex in model.executions:
        if ex.run in callbacks and ex.start.get("batch"):
            return dict(ex.start.get("batch"))
    return None


def _check_counts(
    subject: str,
    opened: Event,
    got: Mapping[str, Any],
    members: list[int],
    final: Mapping[int, Mapping[str, Any]],
    touched: set[int],
) -> list[Finding]:
    problems = []
    if int(got.get("members", -1)) != len(members):
        problems.append(f"members {got.get('members')}, the clients added {len(members)}")
    ended = sum(int(got.get(k, 0)) for k in ("succeeded", "dead", "cancelled", "skipped"))
    if ended != len(members):
        problems.append(f"{ended} members counted ended of {len(members)}")
    # Each member's own outcome, when every member is still there and no operator changed one.
    if all(m in final for m in members) and not set(members) & touched:
        statuses = [str(final[m]["status"]) for m in members]
        if all(s in TERMINAL for s in statuses):
            for status in ("succeeded", "dead", "cancelled"):
                if statuses.count(status) != int(got.get(status, 0)):
                    problems.append(
                        f"{status} {got.get(status)}, but {statuses.count(status)} members are"
                    )
    return [
        Finding("batch-callback-once", subject, f"callback counts wrong: {p}", unique([opened]))
        for p in problems
    ]
