"""The checker's verdict as text: one block per violation (the guarantee, the run or key, the
history lines that show it), the excused cases in short, then what the run exercised."""

from __future__ import annotations

import json
from collections.abc import Iterable

from tests.torture.checker import INVARIANTS, Verdict
from tests.torture.findings import Finding
from tests.torture.history import Event

VALUE_CHARS = 220
EXCUSED_SHOWN = 10


def runs_of(finding: Finding) -> set[int]:
    """The runs a finding is about: its subject's, its handlers', its key's."""
    kind, _, name = finding.subject.partition(" ")
    out = {int(name)} if kind == "run" and name.isdigit() else set()
    for e in finding.lines:
        if e.f in ("handler", "effect"):
            out.add(int(e.get("run")))
        for answer in e.get("answers", []) if e.f == "enqueue" else []:
            if kind == "key" and answer.get("key") == name:
                out.add(int(answer["id"]))
    return out


def shown(event: Event, runs: set[int]) -> dict[str, object]:
    """An observer's sample cut to the rows about ``runs`` (it lists every run that changed)."""
    if event.f != "observe" or not runs:
        return dict(event.value)
    out: dict[str, object] = {}
    for part in ("runs", "gone", "attempts"):
        rows = [row for row in event.get(part, []) if row and row[0] in runs]
        if rows:
            out[part] = rows
    return out


def line(event: Event, t0: int, runs: set[int] | None = None) -> str:
    value = json.dumps(
        shown(event, runs or set()), separators=(",", ":"), sort_keys=True, default=str
    )
    if len(value) > VALUE_CHARS:
        value = value[: VALUE_CHARS - 1] + "…"
    at = (event.t - t0) / 1e9
    return (
        f"    {event.source:<24} {at:+9.3f}s {event.process:<16} {event.type:<6} {event.f} {value}"
    )


def block(finding: Finding, t0: int, label: str) -> list[str]:
    number = INVARIANTS[finding.invariant]
    out = [f"{label} [{number} {finding.invariant}] {finding.subject}: {finding.summary}"]
    if finding.excuse:
        out.append(f"  excused: {finding.excuse}")
    runs = runs_of(finding)
    out += [line(e, t0, runs) for e in finding.lines]
    out += [f"    {note}" for note in finding.notes]
    return out


def counts(title: str, items: Iterable[tuple[str, int]]) -> str:
    pairs = sorted(items)
    if not pairs:
        return f"  {title}: none"
    return f"  {title}: " + ", ".join(f"{k} {v}" for k, v in pairs)


def text(verdict: Verdict) -> str:
    out: list[str] = []
    for finding in verdict.violations:
        out += block(finding, verdict.t0, "VIOLATION")
        out.append("")
    for finding in verdict.excused[:EXCUSED_SHOWN]:
        out += block(finding, verdict.t0, "excused")
        out.append("")
    if len(verdict.excused) > EXCUSED_SHOWN:
        out.append(f"({len(verdict.excused) - EXCUSED_SHOWN} more excused findings, counted below)")
    out.append(f"summary (seed {verdict.seed}):")
    for title, counter in verdict.counts.items():
        out.append(counts(title, counter.items()))
    by_invariant: dict[str, int] = {}
    for finding in verdict.violations:
        by_invariant[finding.invariant] = by_invariant.get(finding.invariant, 0) + 1
    out.append(
        f"{len(verdict.violations)} violations"
        + (
            ": " + ", ".join(f"{k} {v}" for k, v in sorted(by_invariant.items()))
            if by_invariant
            else ""
        )
        + f"; {len(verdict.excused)} excused"
    )
    return "\n".join(out)
