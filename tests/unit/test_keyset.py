"""ClaimBounds: where each type's claim starts, and when it starts from the beginning again."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pgtick.core.keyset import LOOK_SECONDS, MARGIN_SECONDS, MIN_RESCAN_GAP_SECONDS, ClaimBounds

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


class Run:
    def __init__(self, job_type: str, seconds: float, priority: int = 0) -> None:
        self.job_type = job_type
        self.run_at = T0 + timedelta(seconds=seconds)
        self.priority = priority


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
    assert bounds.lows() == {"a": at(9), "b": at(3)} == bounds.for_claim()[0]
    assert bounds.rescans == 1


def test_only_runs_of_priority_0_move_a_bound() -> None:
    bounds = ClaimBounds()
    assert bounds.lows() == {}  # the first claim, from the start
    bounds.claimed([Run("a", 5), Run("a", 60, priority=5), Run("b", 90, priority=-1)])  # type: ignore[list-item]
    assert bounds.lows() == {"a": at(5)}


def test_a_per_key_rate_puts_the_bound_back_to_each_claimed_run_a_window_later() -> None:
    window = 0.3
    bounds = ClaimBounds({"a": window})
    assert bounds.lows() == {}
    claimed(bounds, ("a", 5), ("a", 7), ("b", 20))
    claimed(bounds, ("a", 9))  # within a twentieth of the window: one put-back, to the earliest
    bounds.claimed([Run("a", 1, priority=3)])  # type: ignore[list-item]  # not in the lane
    assert bounds.lows() == {"a": at(9), "b": at(20)}
    pending = bounds.pending()
    assert pending is not None and 0 < pending <= window
    time.sleep(window + 0.05)
    assert bounds.lows() == {"a": T0 + timedelta(seconds=5), "b": at(20)}  # b has no rate
    claimed(bounds, ("a", 12))
    claimed(bounds, ("a", 30))
    assert bounds.lows() == {"a": at(30), "b": at(20)}
    time.sleep(window + 0.05)
    assert bounds.lows() == {"a": T0 + timedelta(seconds=12), "b": at(20)}  # not back to 5


def test_a_rescan_asked_for_waits_for_the_gap_and_happens_once() -> None:
    bounds = ClaimBounds()
    bounds.notifying = lambda: True
    assert bounds.pending() == 0  # the first claim: a scan from the start
    bounds.lows()
    assert bounds.pending() is None  # no bound yet: nothing to look behind
    claimed(bounds, ("a", 5))
    look: Any = bounds.pending()
    assert look is not None and LOOK_SECONDS - 1 < look <= LOOK_SECONDS  # the look back
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


def test_a_due_run_behind_a_bound_lowers_it_at_the_next_claim_only() -> None:
    bounds = ClaimBounds()
    bounds.lows()
    claimed(bounds, ("a", 50), ("b", 40))
    bounds.lower("a", T0 + timedelta(seconds=10))
    bounds.lower("a", T0 + timedelta(seconds=20))  # the earliest announced wins
    bounds.lower("b", T0 + timedelta(seconds=45))  # ahead of b's bound: changes nothing
    bounds.lower("c", T0)  # no bound yet: c's claims scan from the start anyway
    assert bounds.lows() == {"a": T0 + timedelta(seconds=10), "b": at(40)}
    assert bounds.lowerings == 1 and bounds.rescans == 1
    claimed(bounds, ("a", 12))  # the claim from the lowered bound took it; up again later
    claimed(bounds, ("a", 55))
    assert bounds.lows() == {"a": at(55), "b": at(40)}


def test_a_lowering_announced_during_a_claim_survives_that_claims_results() -> None:
    bounds = ClaimBounds()
    bounds.lows()
    claimed(bounds, ("a", 50))
    lows = bounds.lows()  # a claim starts from 49
    bounds.lower("a", T0 + timedelta(seconds=10))  # committed meanwhile, behind it
    claimed(bounds, ("a", 60))  # that claim's results move the bound up
    assert lows == {"a": at(50)}
    assert bounds.lows() == {"a": T0 + timedelta(seconds=10)}  # it starts at the late run


def test_a_look_back_covers_the_range_the_claims_passed_over_since_the_last() -> None:
    """What a claim scanned is behind the bound only once the bound moves past it: a look
    covers, from the lowest such bound, what the claims moving a bound passed over since."""
    bounds = ClaimBounds()
    bounds.notifying = lambda: True
    bounds.look_seconds = 0.0  # every claim may look back
    assert bounds.for_claim() == ({}, {})  # the first claim: from the start, nothing behind
    claimed(bounds, ("a", 5))
    assert bounds.for_claim() == ({"a": at(5)}, {"a": None})  # that claim passed from the start
    assert bounds.for_claim() == ({"a": at(5)}, {})  # no bound moved since: nothing to look at
    claimed(bounds, ("a", 9))
    bounds.look_seconds = math.inf  # two claims without a look
    assert bounds.for_claim() == ({"a": at(9)}, {})
    claimed(bounds, ("a", 12))
    claimed(bounds, ("a", 11))  # moves nothing, passes nothing
    assert bounds.for_claim() == ({"a": at(12)}, {})
    assert not bounds.look_due()
    bounds.look_seconds = 0.0
    assert bounds.look_due()
    assert bounds.for_claim() == ({"a": at(12)}, {"a": at(5)})  # from the lowest bound used
    bounds.found({"a": T0 + timedelta(seconds=2)})  # a look found a run there
    two = T0 + timedelta(seconds=2)
    assert bounds.for_claim() == ({"a": two}, {})
    claimed(bounds, ("a", 14))
    assert bounds.for_claim() == ({"a": at(14)}, {"a": two})
    assert bounds.looks == 3 and bounds.full_looks == 0 and bounds.lowerings == 1


def test_without_notifications_every_look_back_is_from_the_start() -> None:
    bounds = ClaimBounds()  # no listener: nothing announces runs put behind a bound
    bounds.look_seconds = 0.0
    bounds.for_claim()
    claimed(bounds, ("a", 5), ("b", 3))
    bounds.for_claim()
    assert bounds.for_claim() == ({"a": at(5), "b": at(3)}, {"a": None, "b": None})
    assert bounds.full_looks == 2
    bounds.look_seconds = 60.0
    wait: Any = bounds.pending()
    assert wait is not None and 59 < wait <= 60  # an idle dispatcher wakes for the next look
    bounds.notifying = lambda: True
    wait = bounds.pending()
    assert wait is not None and wait > 500  # nothing passed over since: only the full look
    assert not bounds.look_due()


def test_a_run_due_now_announced_as_it_is_enqueued_moves_no_bound() -> None:
    """Its ``!due`` second is at or after the bound, which is a margin below the latest run
    claimed: every enqueue announces one, and the bounds must not churn with them."""
    bounds = ClaimBounds()
    bounds.lows()
    claimed(bounds, ("a", 50.7))
    bounds.lower("a", T0 + timedelta(seconds=50))  # due at 50.9, announced as second 50
    assert bounds.lows() == {"a": at(50.7)} and bounds.lowerings == 0
    bounds.lower("a", T0 + timedelta(seconds=49))  # due at 49.2: behind the bound at 49.7
    assert bounds.lows() == {"a": T0 + timedelta(seconds=49)} and bounds.lowerings == 1


def test_the_idle_probe_starts_at_the_latest_claim_only_while_notifications_arrive() -> None:
    """Without the margin the probe reads none of the second of runs claimed below the latest,
    which a held snapshot keeps; a bound lowered since (an announcement, a look back) and any
    bound without notifications are the claim's own."""
    bounds = ClaimBounds()
    bounds.lows()
    claimed(bounds, ("a", 50), ("b", 40))
    assert bounds.probe_lows() == bounds.lows() == {"a": at(50), "b": at(40)}  # no listener
    bounds.notifying = lambda: True
    latest = {"a": T0 + timedelta(seconds=50), "b": T0 + timedelta(seconds=40)}
    assert bounds.probe_lows() == latest
    assert bounds.for_claim()[0] == {"a": at(50), "b": at(40)}  # claims keep the margin
    bounds.lower("a", T0 + timedelta(seconds=20))  # a run committed behind a's bound
    assert bounds.probe_lows() == {"a": T0 + timedelta(seconds=20), "b": latest["b"]}
    claimed(bounds, ("a", 55))  # claimed from the lowered bound, then up again
    assert bounds.probe_lows() == {"a": T0 + timedelta(seconds=55), "b": latest["b"]}
    bounds.rescan()
    time.sleep(MIN_RESCAN_GAP_SECONDS + 0.01)
    assert bounds.probe_lows() == {}  # a rescan: the probe too reads from the start
