"""Keeps the rollups (storage.rollup) current: the reaper's loop calls ``Rollup.run_once``
every ``ROLLUP_EVERY_SECONDS`` (or at its own interval, if longer), and at its next pass while
a catch-up is not done (a pass works a couple of seconds at most). Any number of daemons call
it; one of them does the work at a time (the others find its lock taken and return).

A failure is logged and tried again at the next interval, never raised: the charts may lag,
but the reaper that calls it must go on recovering runs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import structlog

from pgtick.errors import DatabaseError
from pgtick.storage.store import RunStore, rollup_retention

# How often a daemon rolls up the minutes closed since: a minute is in the charts within
# storage.rollup's ROLLUP_SETTLE_SECONDS plus this after its end.
ROLLUP_EVERY_SECONDS = 20.0

log = structlog.get_logger("pgtick.rollup")


class Rollup:
    """When the next roll-up is due, and how far back a first one reaches (the minutes'
    retention: older minutes would be dropped at once)."""

    def __init__(self, retention_by_status: Mapping[str, float]) -> None:
        self.back_seconds = rollup_retention(retention_by_status)["rollup_minutes"]
        self.next_at = time.monotonic()
        self.failures = 0

    def due(self) -> bool:
        return time.monotonic() >= self.next_at

    def run_once(self, store: RunStore) -> int:
        """Roll up what closed since the last time; the minutes rolled up (0 on failure)."""
        self.next_at = time.monotonic() + ROLLUP_EVERY_SECONDS
        try:
            minutes, caught_up = store.roll_up(self.back_seconds)
        except DatabaseError as exc:
            self.failures += 1
            log.warning("rollup_failed", error=str(exc), retry_in=ROLLUP_EVERY_SECONDS)
            return 0
        if not caught_up:
            self.next_at = time.monotonic()  # the rest at the reaper's next pass
        if minutes > 1:
            log.debug("rolled_up", minutes=minutes, caught_up=caught_up)
        return minutes
