"""What a claim's answer tells the next claims: where they scan from (the bounds, keyset.py),
whether due runs were held back (by a limit, or row-locked by another session: the next claim
waits a moment, ``controls.ClaimTypes.held_back_wait``), and whether a NOTIFY went unanswered
(a run committed behind the bounds: the next claim rescans).

Kept apart from the dispatcher (worker.py) so that its loop reads as the decisions it takes,
not the bookkeeping behind them.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime

from pgtick.core.keyset import ClaimBounds
from pgtick.observability.metrics import Metrics
from pgtick.storage.store import ClaimedRun

# A claim that started this long before a NOTIFY arrived and found runs may have taken the
# runs the NOTIFY announces (the commit comes first, its NOTIFY a moment later).
NOTIFY_SLACK_SECONDS = 0.05


class ClaimAnswers:
    """The claims' answers so far, for the dispatcher's next claim."""

    def __init__(self, bounds: ClaimBounds, metrics: Metrics) -> None:
        self._bounds = bounds
        self._metrics = metrics
        # The last claim found nothing though runs were due: held back by a limit, or
        # row-locked by another session (a claim skips those). The next waits a moment.
        self.held_back = False
        self.empty_claims = 0  # claims in a row that found nothing
        self._notified = threading.Event()  # woken by a NOTIFY since the last claim
        self._notified_at = -math.inf  # monotonic: when the last NOTIFY came
        self._hit_at = -math.inf  # monotonic: when the last claim that found runs started

    def notified(self) -> None:
        """A NOTIFY about a job type this daemon handles came (the listener's thread)."""
        self._notified_at = time.monotonic()
        self._notified.set()

    def sending(self) -> bool:
        """A claim is sent now: whether a NOTIFY came since the last one."""
        notified = self._notified.is_set()
        self._notified.clear()
        return notified

    def claimed(
        self, runs: list[ClaimedRun], behind: dict[str, datetime], sent_at: float, notified: bool
    ) -> None:
        """A claim sent at ``sent_at`` answered ``runs`` and the due runs ``behind`` the
        bounds: move the bounds, count it, and rescan if a NOTIFY went unanswered."""
        self._metrics.claimed(time.monotonic() - sent_at)
        self.held_back = not runs
        self.empty_claims = 0 if runs else self.empty_claims + 1
        self._bounds.claimed(runs)
        self._bounds.found(behind)  # runs behind a bound: the next claim starts at them
        if runs:
            self._hit_at = sent_at
        elif notified and self._hit_at < self._notified_at - NOTIFY_SLACK_SECONDS:
            # Nothing found for a NOTIFY that no claim just before it can have answered
            # (a run committed long after its run_at, behind the bound): rescan.
            self._bounds.missed()
