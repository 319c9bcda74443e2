"""The values the runs' statements take and return (runs.py, run_admin.py, and the store's
callers): the statuses, a run to enqueue, a claimed run, a claim, a lease, a failure, what a
heartbeat found, and what a claimer tells the database about a job type. Kept apart from the
statements so that each module reads as one thing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

TERMINAL_STATUSES = ("succeeded", "dead", "cancelled", "skipped")
ACTIVE_STATUSES = ("queued", "running", "failed")
STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled", "skipped")
# How a running run's last_error ends while its Python handler runs on past its timeout
# (mark_timed_out): the attempt is over, and the run stays held until the handler returns.
TIMED_OUT_RUNNING = "; its handler has not returned yet"


@dataclass(frozen=True)
class NewRun:
    """A run to enqueue."""

    job_type: str
    payload: Mapping[str, Any] | None = None
    run_at: datetime | None = None
    idempotency_key: str | None = None
    max_attempts: int | None = None
    priority: int | None = None  # None: the job type's default (job_type_settings), else 0
    concurrency_key: str | None = None
    # W3C traceparent of the enqueuing span (migration 0018); one that is not valid is
    # stored as NULL (the W3C rule: a bad header starts a new trace, never fails a request).
    traceparent: str | None = None
    # Its chain in normal form (scheduling/steps.py; None: its job type's), and its batch
    # (migrations 0025, 0026).
    follow: Mapping[str, Any] | None = None
    batch_id: int | None = None


@dataclass(frozen=True)
class ClaimType:
    """What a claimer tells the database about a job type it handles: its lease and attempts,
    and its flow-control limits (None: no limit; a rate is (starts, window seconds))."""

    job_type: str
    lease_seconds: float
    max_attempts: int
    max_running: int | None = None
    key_path: tuple[str, ...] | None = None  # the payload field a run's key defaults to
    max_running_per_key: int | None = None
    rate: tuple[int, float] | None = None
    rate_per_key: tuple[int, float] | None = None

    @property
    def limited(self) -> bool:
        return any(
            v is not None
            for v in (self.max_running, self.max_running_per_key, self.rate, self.rate_per_key)
        )


@dataclass(frozen=True)
class FlowState:
    """What one limited job type's limits hold back now (``flow_state``)."""

    job_type: str
    running: int  # held: running, or cancelled and not let go of
    started: int  # starts inside the rate window
    due: int  # due runs not claimed
    waiting_concurrency: int  # of those, held back by max_running or max_running_per_key
    waiting_rate: int  # of those, held back by rate or rate_per_key


class ClaimedRun(NamedTuple):
    """A run this worker now holds. A tuple, and its payload JSON text parsed when asked for:
    the dispatcher makes one per claimed run, on the path every run of a backlog waits on,
    and the handler thread parses the payload it runs with."""

    id: int
    job_type: str
    payload_json: str
    attempt: int
    max_attempts: int
    scheduled_for: datetime | None
    idempotency_key: str | None
    run_at: datetime
    schedule_id: int | None
    started_at: datetime
    locked_until: datetime
    # The claim's lane: only runs of priority 0 move the claimer's bound (keyset.py).
    priority: int = 0
    # W3C traceparent of the span that enqueued it (None: none), read by the claim itself.
    traceparent: str | None = None

    @property
    def payload(self) -> Any:
        # The empty object, the payload of most scheduled runs, without the JSON decoder
        # (0.8 µs a run): a new dict each time, as json.loads would give.
        if self.payload_json == "{}":
            return {}
        return json.loads(self.payload_json)


# A claim of a run: (run id, attempt number). Every write a holder makes is guarded by it, so
# that a result of an earlier claim never lands on a later claim of the same run.
Claim = tuple[int, int]


@dataclass(frozen=True)
class Lease:
    """A held run as the heartbeat renews it: its claim and its lease length."""

    run_id: int
    attempt: int
    seconds: float


@dataclass(frozen=True)
class Failure:
    """One failed attempt to record; ``retry_in_seconds`` None means give up (dead)."""

    run_id: int
    attempt: int
    error: str
    error_type: str
    detail: str
    retry_in_seconds: float | None


@dataclass(frozen=True)
class FailResult:
    id: int
    status: str
    run_at: datetime


@dataclass(frozen=True)
class Beat:
    """What one heartbeat found."""

    held: set[int]  # leases extended (running, or cancelled and not let go of yet)
    registered: bool  # the workers row still exists
    cancelled: set[int]  # given runs an operator cancelled
    busy: set[int] = field(default_factory=set)  # still ours, row-locked elsewhere: not renewed
