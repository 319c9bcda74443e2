"""Where each job type's claim scan starts: the keyset claim's lower bounds.

While another session holds an old snapshot (``pg_dump``, an analytics query, a replica with
``hot_standby_feedback``), vacuum can remove no index entry of a run claimed since, and a claim
that scans ``runs_claim_idx`` from the start visits every one of them: its cost grows with the
time the snapshot is held. The claim therefore starts each type's range scan just below the
``run_at`` this daemon last claimed of it (``MARGIN_SECONDS`` lower, for enqueues that committed
late), so it only visits what was consumed since. Runs due before the bound are the exception:
runs given back (release), materialized or backfilled late, enqueued due in the past, or
committed more than the margin after their ``run_at`` was taken (a long transaction). The first
three send a ``!rescan`` NOTIFY; for all of them every scan starts from the beginning again at
least every ``RESCAN_SECONDS``, which bounds how long such a run can wait.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from pgtick.storage.store import ClaimedRun

MARGIN_SECONDS = 1.0
RESCAN_SECONDS = 2.0
# A rescan asked for (NOTIFY, a release, a notified claim that found nothing) waits this long
# after the previous one: under a held snapshot a scan from the start is the expensive kind.
MIN_RESCAN_GAP_SECONDS = 0.25


class ClaimBounds:
    """The lower bound of each job type's claim; ``rescan`` may be called from any thread,
    the rest from the dispatcher's."""

    def __init__(self, rescan_seconds: float = RESCAN_SECONDS) -> None:
        self._rescan_seconds = rescan_seconds
        self._lows: dict[str, datetime] = {}
        self._last_rescan = -math.inf  # monotonic
        self._next_rescan = 0.0  # the first claim scans from the start
        self._asked = threading.Event()
        self.rescans = 0  # how many scans started from the beginning

    def rescan(self) -> None:
        """Runs may have been put behind the bounds: scan from the start soon."""
        self._asked.set()

    def missed(self) -> None:
        """A NOTIFY said a run is due and the claim found none: it may have committed behind
        a bound (a long transaction), or another daemon took it. Scan from the start soon."""
        self._asked.set()

    def pending(self) -> float | None:
        """Seconds until an asked-for rescan may run (None: none asked for): how long an idle
        dispatcher may sleep before probing again."""
        if not self._asked.is_set():
            return None
        return max(0.0, self._last_rescan + MIN_RESCAN_GAP_SECONDS - time.monotonic())

    def lows(self) -> dict[str, datetime]:
        """The bounds for the next claim or probe (empty: every type from the start)."""
        now = time.monotonic()
        asked = self._asked.is_set() and now >= self._last_rescan + MIN_RESCAN_GAP_SECONDS
        if asked or now >= self._next_rescan:
            self._asked.clear()
            self._lows = {}
            self._last_rescan = now
            self._next_rescan = now + self._rescan_seconds
            self.rescans += 1
        return dict(self._lows)

    def claimed(self, runs: Iterable[ClaimedRun]) -> None:
        """Move each type's bound up to just below the latest ``run_at`` claimed of it: the
        claim takes each type's runs in ``run_at`` order, so the ones it left are not earlier
        (those another claimer held locked are that claimer's, or come back by a rescan)."""
        margin = timedelta(seconds=MARGIN_SECONDS)
        for run in runs:
            low = run.run_at - margin
            current = self._lows.get(run.job_type)
            if current is None or low > current:
                self._lows[run.job_type] = low
