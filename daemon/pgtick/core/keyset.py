"""Where each job type's claim scan starts: the keyset claim's lower bounds.

While another session holds an old snapshot (``pg_dump``, an analytics query, a replica with
``hot_standby_feedback``), vacuum can remove no index entry of a run claimed since, and a claim
that scans ``runs_claim_idx`` from the start visits every one of them: its cost grows with the
time the snapshot is held. The claim therefore starts each type's range scan just below the
``run_at`` this daemon last claimed of it (``MARGIN_SECONDS`` lower, for enqueues that commit a
little late), so it only visits what was consumed since.

Runs can land behind a bound: given back (release), materialized or backfilled late, enqueued
due in the past, skipped by a claim whose transaction then failed, or committed long after
their ``run_at`` was taken (a long application transaction). The next claim scans from the
start (a *rescan*) when one of these is known: a ``!rescan`` NOTIFY (release, materialization,
backfill, an enqueue due in the past), this daemon's own release, a NOTIFY about a type that led
to a claim finding nothing (``missed``), and the ``BehindProbe``: every ``PROBE_SECONDS`` it asks
the database, on a connection of its own, whether any due run waits behind a bound. The probe,
not the claim, pays for the walk over the dead entries, so pickups never wait behind it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

import structlog

from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage.db import retry_delay
from pgtick.storage.store import ClaimedRun, RunStore

MARGIN_SECONDS = 1.0
PROBE_SECONDS = 5.0
# Rescans asked for come at most this often: under a held snapshot a scan from the start is
# the expensive kind, and a burst of NOTIFYs should not make every claim one.
MIN_RESCAN_GAP_SECONDS = 0.25

log = structlog.get_logger("pgtick.keyset")


class ClaimBounds:
    """The lower bound of each job type's claim. ``lows`` and ``claimed`` are the
    dispatcher's; ``rescan``, ``missed`` and ``snapshot`` may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lows: dict[str, datetime] = {}
        self._last_rescan = -math.inf  # monotonic
        self._asked = threading.Event()
        self._asked.set()  # the first claim scans from the start
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
        with self._lock:
            if self._asked.is_set() and now >= self._last_rescan + MIN_RESCAN_GAP_SECONDS:
                self._asked.clear()
                self._lows = {}
                self._last_rescan = now
                self.rescans += 1
            return dict(self._lows)

    def snapshot(self) -> dict[str, datetime]:
        """The current bounds, for the probe."""
        with self._lock:
            return dict(self._lows)

    def claimed(self, runs: Iterable[ClaimedRun]) -> None:
        """Move each type's bound up to just below the latest ``run_at`` claimed of it: the
        claim takes each type's runs in ``run_at`` order, so the ones it left are not earlier
        (those another claimer held locked are that claimer's, or the probe finds them)."""
        margin = timedelta(seconds=MARGIN_SECONDS)
        with self._lock:
            for run in runs:
                low = run.run_at - margin
                current = self._lows.get(run.job_type)
                if current is None or low > current:
                    self._lows[run.job_type] = low


class BehindProbe:
    """Every ``PROBE_SECONDS``: is a due run waiting behind a bound? Then rescan, now."""

    def __init__(
        self,
        store: RunStore,
        bounds: ClaimBounds,
        wake: Callable[[], None],
        metrics: Metrics,
        interval: float = PROBE_SECONDS,
    ) -> None:
        self._store = store
        self._bounds = bounds
        self._wake = wake
        self._metrics = metrics
        self._interval = interval
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.found = 0  # probes that found runs behind a bound

    def probe(self) -> list[str]:
        """The job types with a due run behind their bound; asks for a rescan if any."""
        lows = self._bounds.snapshot()
        behind = self._store.behind_bounds(lows) if lows else []
        if behind:
            self.found += 1
            log.debug("runs_behind_claim_bounds", job_types=behind)
            self._bounds.rescan()
            self._wake()
        return behind

    def run(self) -> None:
        failures = 0
        while not self.stop_event.wait(self._interval if not failures else retry_delay(failures)):
            self.alive_at = time.monotonic()
            try:
                self.probe()
                failures = 0
            except DatabaseError as exc:
                failures += 1
                self._metrics.db_error("keyset_probe")
                log.warning("keyset_probe_failed", error=str(exc), retry_in=retry_delay(failures))
