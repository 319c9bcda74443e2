"""The observer: once a second, what the runs table holds, written as changes to the history.

Each sample is one REPEATABLE READ snapshot: the runs that are not terminal, held, or changed
in the last seconds, and which of the runs it follows (not terminal, held, or with an
idempotency key at their last sight) no longer exist. A history line carries the runs whose
(status, holder, attempt) changed since the sample before, the runs gone since (each with the
time of the last sample that saw it), and the attempts that ended since (retention drops them
long before the end). The checker learns from it when a run existed (idempotency), that a run
was terminal before retention took it (nothing lost), that a held run was removed, and how
each attempt was recorded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from tests.torture.history import ATTEMPTS_COLUMNS, INFO, HistoryFile

SAMPLE_SECONDS = 1.0
TERMINAL = ("succeeded", "dead", "cancelled", "skipped")
RUN_COLUMNS = "id, status, job_type, locked_by, attempts, idempotency_key"
RECENT = f"""
SELECT {RUN_COLUMNS}
FROM pgtick.runs
WHERE status IN ('queued', 'running', 'failed') OR locked_by IS NOT NULL
   OR updated_at > now() - interval '10 seconds'
"""
# The runs it follows that RECENT did not return: gone, or changed with an updated_at already
# older than its window (a finish whose statement waited behind another run's row lock commits
# with the time it started: seed 103 saw two runs' success 12 s late, never in RECENT).
STILL_THERE = f"""
SELECT {RUN_COLUMNS}
FROM pgtick.runs WHERE id = ANY(%s::bigint[])
"""
# Attempts that ended lately: retention drops them (and their runs) long before the end.
ENDED = f"""
SELECT {ATTEMPTS_COLUMNS} FROM pgtick.attempts
WHERE finished_at > now() - interval '120 seconds'
"""

STALL_TICK_SECONDS = 0.25
STALL_REPORT_SECONDS = 1.5
State = tuple[str, str, str | None, int, str | None]  # status, job_type, holder, attempts, key


def _state(row: tuple[Any, ...]) -> State:
    """A row of RUN_COLUMNS as the state followed (its id aside)."""
    return (row[1], row[2], row[3], int(row[4]), row[5])


@dataclass
class Observer:
    dsn: str
    history: HistoryFile
    stop_event: threading.Event = field(default_factory=threading.Event)
    last: dict[int, State] = field(default_factory=dict)
    last_seen: dict[int, int] = field(default_factory=dict)  # time_ns of the last sample it was in
    ended: set[tuple[Any, ...]] = field(default_factory=set)  # attempts already written
    samples: int = 0

    def follows(self, state: State) -> bool:
        status, _, holder, _, key = state
        return status not in TERMINAL or holder is not None or key is not None

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while not self.stop_event.wait(SAMPLE_SECONDS):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(
                        self.dsn, application_name="torture-observer", connect_timeout=5
                    )
                    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                self.sample(conn)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            rows = conn.execute(RECENT).fetchall()
            seen: dict[int, State] = {int(r[0]): _state(r) for r in rows}
            followed = [i for i, s in self.last.items() if i not in seen and self.follows(s)]
            still = conn.execute(STILL_THERE, [followed]).fetchall()
            present = {int(r[0]) for r in still}
            seen.update({int(r[0]): _state(r) for r in still})
            db_now = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
            attempts = [tuple(r) for r in conn.execute(ENDED).fetchall()]
        now = time.time_ns()
        gone = [i for i in followed if i not in present]
        changed = [[i, *s] for i, s in seen.items() if self.last.get(i) != s]
        departed = [[i, *self.last[i], self.last_seen.get(i)] for i in gone]
        for i in gone:
            del self.last[i]
            self.last_seen.pop(i, None)
        for i in (*seen, *present):
            self.last_seen[i] = now
        self.last.update(seen)
        fresh = [list(a) for a in attempts if a not in self.ended]
        self.ended.update(attempts)
        self.samples += 1
        if changed or departed or fresh:
            value: dict[str, Any] = {"runs": changed, "gone": departed, "attempts": fresh}
            value["db_now"] = db_now[0] if db_now else None
            self.history.write(INFO, "observe", value, process="observer")


@dataclass
class StallWatch:
    """The host's stalls as the harness feels them: a thread that sleeps a quarter of a second
    and writes down each wake-up much later than that. By the monotonic clock that is CPU
    starvation; by the wall clock alone it is the host paused (a VM snapshot or migration stops
    the monotonic clock too, and the wall clock, which the server's leases are measured by,
    jumps on at resume). A daemon stalled as long cannot renew its lease either: the checker
    excuses what such a stall explains, and says so."""

    history: HistoryFile
    stop_event: threading.Event = field(default_factory=threading.Event)
    monotonic: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time

    def run(self) -> None:
        last, last_wall = self.monotonic(), self.wall()
        while not self.stop_event.wait(STALL_TICK_SECONDS):
            now, now_wall = self.monotonic(), self.wall()
            late = now - last - STALL_TICK_SECONDS
            jumped = now_wall - last_wall - STALL_TICK_SECONDS
            stalled = max(late, jumped)
            if stalled > STALL_REPORT_SECONDS:
                value: dict[str, Any] = {"seconds": round(stalled, 2)}
                if jumped > late + STALL_REPORT_SECONDS:
                    value["paused"] = True
                self.history.write(INFO, "stall", value, process="stall-watch")
            last, last_wall = now, now_wall
