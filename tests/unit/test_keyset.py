"""ClaimBounds: where each type's claim starts, and when it starts from the beginning again."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pgtick.core.keyset import MARGIN_SECONDS, MIN_RESCAN_GAP_SECONDS, ClaimBounds

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


class Run:
    def __init__(self, job_type: str, seconds: float) -> None:
        self.job_type = job_type
        self.run_at = T0 + timedelta(seconds=seconds)


def claimed(bounds: ClaimBounds, *runs: tuple[str, float]) -> None:
    bounds.claimed([Run(t, s) for t, s in runs])  # type: ignore[misc]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds - MARGIN_SECONDS)


def test_the_first_claim_scans_from_the_start_then_each_type_from_its_latest_claim() -> None:
    bounds = ClaimBounds()
    assert bounds.lows() == {}
    claimed(bounds, ("a", 5), ("a", 9), ("b", 3))
    assert bounds.lows() == {"a": at(9), "b": at(3)}
    claimed(bounds, ("a", 7))  # an earlier run_at never moves a bound down
    assert bounds.lows() == {"a": at(9), "b": at(3)} == bounds.snapshot()
    assert bounds.rescans == 1


def test_a_rescan_asked_for_waits_for_the_gap_and_happens_once() -> None:
    bounds = ClaimBounds()
    bounds.lows()
    claimed(bounds, ("a", 5))
    assert bounds.pending() is None
    bounds.rescan()
    bounds.missed()
    wait: Any = bounds.pending()
    assert wait is not None and 0 < wait <= MIN_RESCAN_GAP_SECONDS
    assert bounds.lows() == {"a": at(5)}  # within the gap of the first scan: not yet
    time.sleep(wait + 0.01)
    assert bounds.pending() == 0
    assert bounds.lows() == {}
    assert bounds.pending() is None
    claimed(bounds, ("a", 6))
    assert bounds.lows() == {"a": at(6)}
    assert bounds.rescans == 2
