"""Job output: the ``output_chunks`` an attempt writes while it runs, and what ``pgtick logs``
and ``pgtick show`` read back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from pgtick.storage.base import StoreBase


@dataclass(frozen=True)
class Chunk:
    """One chunk to write: ``seq`` >= 0 a head chunk, < 0 a tail slot; ``lines`` as
    (offset_ms, stream, text); ``omitted_bytes`` what is kept neither in head nor tail."""

    seq: int
    lines: Sequence[tuple[int, str, str]]
    omitted_bytes: int


@dataclass(frozen=True)
class StoredChunk:
    """A chunk as read back."""

    attempt: int
    attempt_started_at: datetime
    seq: int
    at: datetime
    lines: list[tuple[int, str, str]]
    omitted_bytes: int


@dataclass(frozen=True)
class AttemptState:
    """What ``pgtick logs --follow`` needs to know of a run: its status, its latest attempt,
    and the outcome of the attempt followed (None while it runs)."""

    status: str
    attempts: int
    outcome: str | None


class OutputQueries(StoreBase):
    def write_output(
        self,
        worker_id: str,
        run_id: int,
        attempt: int,
        started_at: datetime | None,
        chunks: Sequence[Chunk],
        *,
        committed: bool = False,
    ) -> int:
        """Write chunks of one attempt in one statement, guarded by the claim; returns how
        many were written (0: the run is no longer this worker's attempt). ``committed``: the
        handler committed the attempt's success itself (ctx.transaction()), so the run is no
        longer held, and the guard is that this worker ended the attempt."""
        if not chunks:
            return 0
        params: dict[str, Any] = {
            "run_id": run_id,
            "attempt": attempt,
            "worker_id": worker_id,
            "started_at": started_at,
            "seqs": [chunk.seq for chunk in chunks],
            "lines": [Jsonb([list(line) for line in chunk.lines]) for chunk in chunks],
            "omitted": [chunk.omitted_bytes for chunk in chunks],
        }
        query = "output_write_committed" if committed else "output_write"
        return len(self._all("output", query, params))

    def read_output(self, run_id: int, attempt: int | None = None) -> list[StoredChunk]:
        """A run's chunks (of one attempt, or all) in the order they are shown."""
        rows = self._all("output", "output_read", {"run_id": run_id, "attempt": attempt})
        return [
            StoredChunk(a, started, seq, at, [(int(t), str(s), str(x)) for t, s, x in lines], om)
            for a, started, seq, at, lines, om in rows
        ]

    def attempt_state(self, run_id: int, attempt: int) -> AttemptState | None:
        """The run's status and latest attempt, and that attempt's outcome; None: no run."""
        rows = self._all("output", "output_attempt_state", {"run_id": run_id, "attempt": attempt})
        if not rows:
            return None
        status, attempts, outcome = rows[0]
        return AttemptState(status, attempts, outcome)
