"""Guarantee 3 under runtime controls (docs/guarantees.md, "Runtime controls"): the limit a
start is judged against is the one in force at that moment, and a paused job type starts
nothing from one poll interval after its pause until its resume.

An operator's change (``pgtick limits``, ``pause``, ``resume``) is a CLI call: its invoke line
comes before its transaction commits, its answer after. What is in force at a moment is
certain only outside those windows, so each limit has two readings: the strict one (the last
answered change before the moment, the one before it while a change is in flight) and the
lenient one (the highest that a run claimed up to ``CLAIM_SLACK_SECONDS`` before its start
could have been counted against: a run claimed ahead of a free thread starts a little later).
A start over the strict limit but within the lenient one is an excused finding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from pgtick.service.child import RELAY_STALE_SECONDS
from tests.torture.findings import Finding, unique
from tests.torture.history import INVOKE, OK, Event
from tests.torture.model import NS, Execution, Model
from tests.torture.plan import POLL_SECONDS, JobType

# A run claimed before a change may start this much later (waiting for a thread, prefetched).
CLAIM_SLACK_SECONDS = 3.0
# A pause holds from the daemons' next read of it: a NOTIFY, at the latest a poll interval;
# plus the claims already in flight and a loaded 2-core machine's scheduling.
PAUSE_SLACK_SECONDS = POLL_SECONDS + 2.0


@dataclass(frozen=True)
class Change:
    """One operator's call: invoked at ``begin``, answered at ``end`` (None: never)."""

    begin: int
    end: int | None
    value: float  # the limit it sets (math.inf: none), or 1.0 paused / 0.0 resumed
    line: Event
    # Answered ok: in force from its answer. A failed call (the CLI's exit 3 while the server
    # restarts) most likely changed nothing, but one whose commit was cut off may have: it is
    # never taken as in force, and may be in force from its invoke on.
    ok: bool = True


def _calls(model: Model, verbs: tuple[str, ...], job_type: str) -> list[Change]:
    """The answered or unanswered calls of ``verbs`` on ``job_type``, in invoke order."""
    invoked: dict[tuple[str, str], Event] = {}
    out: list[Change] = []
    for e in model.operations:
        if e.f not in verbs or e.get("job_type") != job_type:
            continue
        key = (e.process, e.f)
        if e.type == INVOKE:
            invoked[key] = e
            continue
        start = invoked.pop(key, None)
        if start is not None:
            out.append(Change(start.t, e.t, _value(start), start, e.type == OK))
    out += [Change(e.t, None, _value(e), e) for e in invoked.values()]
    return sorted(out, key=lambda c: c.begin)


def _value(e: Event) -> float:
    if e.f == "limits":
        most = e.get("max_running")
        return -1.0 if most is None else float(most)  # -1: reset to the config's
    return 1.0 if e.f == "pause" else 0.0


def max_running_at(model: Model, jt: JobType) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """(strict, lenient): the max_running of ``jt`` in force at a moment, as above."""
    config = float(jt.max_running) if jt.max_running is not None else math.inf
    changes = [
        dataclasses.replace(c, value=config if c.value < 0 else c.value)
        for c in _calls(model, ("limits",), jt.name)
    ]

    def possible(t: int) -> list[float]:
        """Every value that may be in force at ``t``."""
        values = [config]
        for c in changes:
            if c.begin > t:
                break
            if c.end is not None and c.end <= t and c.ok:
                values = [c.value]  # answered: from the next claim on
            else:
                values.append(c.value)  # in flight, or its answer never came
        if model.old_until is not None and t < model.old_until:
            values.append(config)  # a daemon of the previous release knows only the config's
        return values

    def strict(t: int) -> int:
        return _int(max(possible(t)))

    def lenient(t: int) -> int:
        begin = t - int(CLAIM_SLACK_SECONDS * NS)
        edges = [begin, t, *(c.begin for c in changes), *(c.end for c in changes if c.end)]
        return _int(max(v for edge in edges if begin <= edge <= t for v in possible(edge)))

    return strict, lenient


def _int(value: float) -> int:
    return 2**31 if math.isinf(value) else int(value)


def paused_not_started(model: Model) -> list[Finding]:
    """A paused job type starts nothing from ``PAUSE_SLACK_SECONDS`` after `pgtick pause`
    answered ok until `pgtick resume` was invoked: its runs stay queued."""
    out = []
    for jt in model.world.job_types:
        calls = _calls(model, ("pause", "resume"), jt.name)
        windows = []
        for i, c in enumerate(calls):
            if c.value != 1.0 or c.end is None or not c.ok:
                continue  # a pause judged only once it answered ok
            after = next((r for r in calls[i + 1 :] if r.value == 0.0), None)
            until = after.begin if after is not None else model.end
            begin = c.end + int(PAUSE_SLACK_SECONDS * NS)
            if model.old_until is not None:
                begin = max(begin, model.old_until)  # the previous release knows no pause
            windows.append((begin, until, c.end, c.line, after))
        for begin, until, answered, paused, resumed in windows:
            started = [
                e
                for e in model.executions
                if e.job_type == jt.name
                and begin < e.begin < until
                and not _relay_frozen(model, e, answered)
            ]
            if not started:
                continue
            stall = model.stall_between(begin - int(PAUSE_SLACK_SECONDS * NS), until, NS)
            out.append(
                Finding(
                    "paused",
                    f"job type {jt.name}",
                    f"{len(started)} handler(s) started while it was paused: "
                    + "; ".join(e.describe() for e in started[:3]),
                    unique(
                        [paused, *(e.start for e in started[:3]), resumed.line if resumed else None]
                    ),
                    excuse="the harness was starved of CPU meanwhile" if stall else "",
                )
            )
    return out


def _relay_frozen(model: Model, e: Execution, answered: int) -> bool:
    """``e`` started on worker processes whose supervisor was frozen after the pause was
    answered, within the time they take to read the controls without it: a NOTIFY reaches
    them through their supervisor, so while it is frozen (SIGSTOP) they read the controls by
    their own poll interval (the daemon's times the processes) once its word is older than
    ``RELAY_STALE_SECONDS``."""
    if model.processes < 2:
        return False  # a frozen daemon starts nothing
    slack = RELAY_STALE_SECONDS + POLL_SECONDS * model.processes + 2.0
    if e.begin > answered + int(slack * NS):
        return False
    return (
        model.frozen_between(e.daemon, answered - int(RELAY_STALE_SECONDS * NS), e.begin)
        is not None
    )
