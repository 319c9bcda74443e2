"""What a run printed (``pgtick logs``, the tail in ``pgtick show``): its stored output chunks
turned into lines in order, with the omitted-bytes marker between head and tail, and the
follow loop that shows a running attempt's lines as they are written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pgtick.errors import NotFoundError, UsageError
from pgtick.storage.store import RunStore, StoredChunk

OUTPUT_STREAMS = ("stdout", "stderr", "log")
FOLLOW_POLL_SECONDS = 0.25
SHOW_TAIL_LINES = 10


@dataclass(frozen=True)
class OutputLine:
    """One line an attempt printed; ``stream`` "omitted" is the marker, ``omitted_bytes`` > 0."""

    attempt: int
    offset_ms: int
    stream: str
    text: str
    omitted_bytes: int = 0

    @property
    def is_marker(self) -> bool:
        return self.stream == "omitted"


def _check(store: RunStore, run_id: int, attempt: int | None) -> int:
    """The run's attempts so far; NotFoundError for no run or no such attempt."""
    if run_id < 1:
        raise UsageError(f"RUN_ID: not a run id: {run_id} (ids start at 1)")
    state = store.attempt_state(run_id, attempt or 0)
    if state is None:
        raise NotFoundError(f"run {run_id} not found")
    if attempt is not None and not 1 <= attempt <= state.attempts:
        had = "has not started yet" if state.attempts == 0 else f"has had {state.attempts}"
        raise NotFoundError(f"run {run_id} has no attempt {attempt} (it {had})")
    return state.attempts


def lines_of(chunks: list[StoredChunk], stream: str | None = None) -> list[OutputLine]:
    """The chunks as lines in order, a marker before the tail where bytes were omitted."""
    out: list[OutputLine] = []
    marked: set[tuple[int, object]] = set()
    omitted: dict[tuple[int, object], int] = {}
    for c in chunks:
        key = (c.attempt, c.attempt_started_at)
        omitted[key] = max(omitted.get(key, 0), c.omitted_bytes)
    for c in chunks:
        key = (c.attempt, c.attempt_started_at)
        if c.seq < 0 and key not in marked:
            marked.add(key)
            if omitted[key]:
                out.append(
                    OutputLine(
                        c.attempt, c.lines[0][0] if c.lines else 0, "omitted", "", omitted[key]
                    )
                )
        for offset_ms, name, text in c.lines:
            if stream is None or name == stream:
                out.append(OutputLine(c.attempt, offset_ms, name, text))
    return out


def run_output(
    store: RunStore, run_id: int, attempt: int | None = None, stream: str | None = None
) -> list[OutputLine]:
    """What a run printed, every attempt (or one), in order."""
    _check(store, run_id, attempt)
    return lines_of(store.read_output(run_id, attempt), stream)


def output_tail(store: RunStore, run_id: int, count: int = SHOW_TAIL_LINES) -> list[OutputLine]:
    """The last ``count`` lines of the run's latest attempt that printed anything."""
    chunks = store.read_output(run_id)
    if not chunks:
        return []
    last = chunks[-1]
    latest = [
        c
        for c in chunks
        if (c.attempt, c.attempt_started_at) == (last.attempt, last.attempt_started_at)
    ]
    return lines_of(latest)[-count:]


# A run in these states starts no further attempt.
NEVER_STARTS = frozenset({"succeeded", "dead", "cancelled", "skipped"})


def follow_output(
    store: RunStore,
    run_id: int,
    attempt: int | None,
    stream: str | None,
    emit: Callable[[OutputLine], None],
    *,
    poll_seconds: float = FOLLOW_POLL_SECONDS,
) -> tuple[int, str]:
    """Show an attempt's lines as they are written (the latest attempt, waiting for the first
    to start if none has) until it ends; returns its number and its outcome (succeeded,
    failed, lost, released, cancelled)."""
    attempts = _check(store, run_id, attempt)
    number = attempt or max(attempts, 1)
    shown: dict[tuple[object, int], tuple[tuple[int, str, str] | None, int]] = {}
    omitted_shown = 0
    while True:
        state = store.attempt_state(run_id, number)
        if state is None:
            raise NotFoundError(f"run {run_id} not found")
        done = (
            state.outcome is not None
            or state.attempts > number
            or (state.attempts == number and state.status not in ("running", "cancelled"))
            # Ended before this attempt started (cancelled or skipped while queued): it never
            # will.
            or (state.attempts < number and state.status in NEVER_STARTS)
        )
        for c in store.read_output(run_id, number):
            key = (c.attempt_started_at, c.seq)
            first, count = shown.get(key, (None, 0))
            if c.lines and first is not None and c.lines[0] != first:
                count = 0  # a tail slot reused for newer lines
            if c.seq < 0 and c.omitted_bytes > omitted_shown:
                gone = c.omitted_bytes - omitted_shown
                omitted_shown = c.omitted_bytes
                emit(OutputLine(c.attempt, c.lines[0][0] if c.lines else 0, "omitted", "", gone))
            for offset_ms, name, text in c.lines[count:]:
                if stream is None or name == stream:
                    emit(OutputLine(c.attempt, offset_ms, name, text))
            shown[key] = (c.lines[0] if c.lines else None, len(c.lines))
        if done:
            if state.outcome is not None:
                return number, state.outcome
            return number, "cancelled" if state.status == "cancelled" else state.status
        time.sleep(poll_seconds)
