"""Guarantees 1 and 7: one run per idempotency key while it exists, whatever the isolation
level of the enqueuing transaction; one run per schedule occurrence, and a skip schedule never
running two of its runs at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.torture.findings import Finding, attempts_of, taken, unique
from tests.torture.history import OK, Event
from tests.torture.model import Enqueue, Model

# -- 1 idempotency ---------------------------------------------------------------------------------


@dataclass
class KeyFacts:
    """Which runs carry which key, and when each run is known to have existed."""

    runs_of: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    seen: dict[int, list[tuple[int, Event | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    creator: dict[int, Enqueue] = field(default_factory=dict)

    def answered(self, enq: Enqueue) -> None:
        """A committed transaction's answers: each keyed run existed when it committed."""
        end = enq.end
        if end is None or not enq.committed:
            return
        for answer in enq.answers:
            if answer.get("key") is not None:
                self.saw(answer["key"], answer["id"], end.t, end)
                if answer.get("created"):
                    self.creator[answer["id"]] = enq

    def saw(self, key: str | None, run: int, t: int, line: Event | None) -> None:
        if key is not None:
            self.runs_of[key].add(run)
        self.seen[run].append((t, line))


def key_facts(model: Model) -> KeyFacts:
    """A run existed when a committed enqueue answered it, when the observer saw it, when a
    handler started on it (claimed), and at the end if the final state has it; not while a
    handler merely ran on (held-run-kept shows a run removed under its handler)."""
    facts = KeyFacts()
    for enq in model.enqueues:
        facts.answered(enq)
    for run, s in model.sightings.items():
        for t, row, line in s.states:
            if row[5] is not None:
                facts.saw(row[5], run, t, line)
        if s.gone_state is not None and s.gone_state[5] is not None and s.last_seen:
            facts.saw(s.gone_state[5], run, s.last_seen, s.gone)
    for ex in model.executions:
        if ex.run in facts.seen:
            facts.saw(None, ex.run, ex.begin, ex.start)
    for run, final in model.final_runs().items():
        if final.get("key"):
            facts.saw(final["key"], run, model.end, None)
    return facts


def idempotency(model: Model) -> list[Finding]:
    """At most one run per idempotency key while that run exists, whatever the isolation level
    of the enqueuing transaction; the ids returned for a key's enqueues are the same."""
    facts = key_facts(model)
    final = model.final_runs()
    out = []
    for key, runs in sorted(facts.runs_of.items()):
        spans = {
            r: (min(t for t, _ in facts.seen[r]), max(t for t, _ in facts.seen[r]))
            for r in runs
            if facts.seen[r]
        }
        ordered = sorted(spans, key=lambda r: spans[r][0])
        for i, a in enumerate(ordered):
            clash = next((b for b in ordered[i + 1 :] if spans[b][0] <= spans[a][1]), None)
            if clash is not None:
                out.append(two_runs_for_a_key(key, a, clash, facts, final))
                break
    return out


def two_runs_for_a_key(
    key: str, a: int, b: int, facts: KeyFacts, final: Mapping[int, Mapping[str, Any]]
) -> Finding:
    lines: list[Event | None] = []
    levels = []
    for run in (a, b):
        enq = facts.creator.get(run)
        if enq is not None:
            lines += [enq.invoke, enq.end]
            levels.append(f"{run} by a {enq.invoke.get('isolation')} transaction")
        else:
            levels.append(f"{run}")
    # The last sight of the first run that is not before the second one existed.
    b_from = min(t for t, _ in facts.seen[b])
    after = sorted((t, line) for t, line in facts.seen[a] if t >= b_from and line is not None)
    lines.append(after[0][1] if after else None)
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
            b = next(
                (b for b in mine[i + 1 :] if b.run != a.run and b.begin < a.surely_until), None
            )
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
                else taken(model, a, b.begin)[0]
            )
            out.append(
                Finding(
                    "schedule-once",
                    f"schedule {s.name}",
                    f"overlap = skip, yet two of its runs at once: {a.describe()} and"
                    f" {b.describe()}",
                    unique([*a.events(), *b.events()]),
                    attempts_of(model, [a.run, b.run]),
                    excuse,
                )
            )
            break
    return out
