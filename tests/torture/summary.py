"""What a run exercised: counts of each operation, fault and handler behaviour, of the daemons'
lives, of the final states and why runs were still pending, and of the excused findings."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tests.torture.findings import Finding
from tests.torture.history import FAIL, INVOKE, OK, Event
from tests.torture.model import Model

FAULT_KINDS = (
    "kill",
    "term",
    "freeze",
    "terminate-backend",
    "pg-restart",
    "row-lock",
    "held-snapshot",
    "migrate",
)
OPERATOR_VERBS = ("cancel", "retry", "prune", "pause", "resume", "limits")
# Composition: a chain enqueued; a batch opened, members added, closed (`pgtick batch close`).
COMPOSITION = ("chain", "batch-open", "batch-add", "batch")


def summary(model: Model, findings: Sequence[Finding]) -> dict[str, Counter[str]]:
    """Counts of each operation, fault and behaviour exercised, and of the final states."""
    return {
        "operations": operations(model),
        "faults": faults(model.operations),
        "handlers": handlers(model),
        "daemons": daemons(model),
        "final runs": Counter(r["status"] for r in model.final.get("runs", [])),
        "pending at the stop": pending(model),
        "excused": Counter(f"{f.invariant}: {f.excuse}" for f in findings if f.excuse),
    }


def operations(model: Model) -> Counter[str]:
    ops: Counter[str] = Counter()
    for enq in model.enqueues:
        ops[f"enqueue {enq.end.get('outcome', 'unknown') if enq.end else 'unfinished'}"] += 1
        ops[f"enqueue at {enq.invoke.get('isolation')}"] += 1
        ops[f"enqueue via {enq.invoke.get('api')}"] += 1
        ops["enqueue in a key race"] += enq.invoke.get("race") is not None
        if enq.committed:
            ops["runs created"] += sum(1 for a in enq.answers if a.get("created"))
            ops["runs keyed"] += sum(1 for a in enq.answers if a.get("key"))
    for e in model.operations:
        if e.f in OPERATOR_VERBS and e.type != INVOKE:
            ops[f"{e.f} {'skipped' if e.get('skipped') else 'exit ' + str(e.get('exit'))}"] += 1
        elif e.f in COMPOSITION and e.type != INVOKE:
            name = "batch close" if e.f == "batch" else e.f.replace("-", " ")
            ops[f"{name} {e.type}"] += 1
    return ops


def faults(lines: Sequence[Event]) -> Counter[str]:
    """Each fault once: by its first line (a kill has one), or as skipped or failed."""
    out: Counter[str] = Counter()
    for e in lines:
        if e.f not in FAULT_KINDS:
            continue
        if e.get("skipped"):
            out[f"{e.f} skipped"] += 1
        elif e.type == (OK if e.f == "kill" else INVOKE):
            out[e.f] += 1
        elif e.type == FAIL:
            out[f"{e.f} failed"] += 1
    return out


def handlers(model: Model) -> Counter[str]:
    out: Counter[str] = Counter()
    for ex in model.executions:
        out[ex.behaviour] += 1
        if ex.returned:
            out["-> returned"] += 1
        elif ex.end is not None:
            out["-> raised"] += 1
        else:
            out["-> died with its daemon" if ex.died_at else "-> no end line"] += 1
    return out


def daemons(model: Model) -> Counter[str]:
    out: Counter[str] = Counter()
    for d in model.daemons.values():
        out["started"] += 1
        if d.exit is not None:
            out[f"exit {d.exit.get('code')} after {d.exit.get('told') or 'nothing'}"] += 1
    return out


def pending(model: Model) -> Counter[str]:
    """Why each run not ended at the stop was still waiting."""
    out: Counter[str] = Counter()
    for r in model.final.get("runs", []):
        if r["status"] in ("queued", "failed"):
            why = "not due yet" if r.get("future") else "due at the stop (backlog)"
            out[f"{r['status']} {r['job_type']}: {why}"] += 1
    return out
