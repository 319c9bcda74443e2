"""The checker: one function per guarantee of docs/guarantees.md, over a history and the final
state of the database. It knows the promises, not the implementation (no pgtick import).

Each function returns findings: a violation names the guarantee, the run, key or job type, and
the smallest slice of history that shows it (the lines, by file and line number, and what the
final state adds); an excused finding is a documented exception (a daemon frozen past its
lease, an outage of the server, an operator's cancel), counted and shown, never dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.torture.composition import batch_callback_once, chain_once
from tests.torture.controls import paused_not_started
from tests.torture.daemons import daemon_lifecycle
from tests.torture.findings import Finding
from tests.torture.history import Event
from tests.torture.idempotency import idempotency, schedule_once
from tests.torture.locking import held_run_kept, lease_kept, limits, single_execution
from tests.torture.model import Model, build
from tests.torture.retries import (
    effects_once,
    no_loss,
    only_successes_recorded,
    success_recorded,
)
from tests.torture.summary import summary
from tests.torture.upgrade import enqueue_refused, migrated

# Numbered as the issue lists them; lease-kept is the lease that comes before a second copy,
# held-run-kept the promise that retention never removes a held run, apart from the limit it breaks.
INVARIANTS = {
    "idempotency": 1,
    "single-execution": 2,
    "lease-kept": 2,
    "limits": 3,
    "paused": 3,
    "held-run-kept": 3,
    "no-loss": 4,
    "enqueue-refused": 4,
    "migrated": 4,
    "success-recorded": 5,
    "effects-once": 6,
    "schedule-once": 7,
    "daemon-lifecycle": 8,
    "chain-once": 16,
    "batch-callback-once": 17,
}


@dataclass
class Verdict:
    """The checker's answer: the violations, the excused findings, the counts."""

    seed: int
    t0: int
    violations: list[Finding]
    excused: list[Finding]
    counts: dict[str, Counter[str]] = field(default_factory=dict)


CHECKS: tuple[Callable[[Model], list[Finding]], ...] = (
    idempotency,
    single_execution,
    lease_kept,
    limits,
    paused_not_started,
    held_run_kept,
    no_loss,
    enqueue_refused,
    migrated,
    success_recorded,
    only_successes_recorded,
    effects_once,
    schedule_once,
    daemon_lifecycle,
    chain_once,
    batch_callback_once,
)


def check(
    raw_plan: Mapping[str, Any], events: Sequence[Event], final: Mapping[str, Any]
) -> Verdict:
    """Every guarantee's check over the history and the final state of one run."""
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
