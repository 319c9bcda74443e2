"""Where each job type's claim scan starts: the keyset claim's lower bounds.

While another session holds an old snapshot (``pg_dump``, an analytics query, a replica with
``hot_standby_feedback``), vacuum can remove no index entry of a run claimed since, and a claim
that scans ``runs_claim_idx`` from the start visits every one of them: its cost grows with the
time the snapshot is held. The claim therefore starts each type's range scan just below the
``run_at`` this daemon last claimed of it (``MARGIN_SECONDS`` lower, for enqueues that commit a
little late), so it only visits what was consumed since.

Runs can land behind a bound: enqueued due in the past or committed long after their
``run_at`` was taken (a long application transaction), recovered by the reaper with their
``run_at`` kept, given back (release), materialized or backfilled late, or skipped by a claim
because another claimer's transaction held them, which then rolled back. Each is found
without a scan from the start where it can be:

- a ``!due SECONDS JOB_TYPE`` NOTIFY (enqueue, the reaper, a release) and this daemon's own
  release lower the type's bound to that second (``lower``);
- a ``!rescan`` NOTIFY (materialization, backfill) and a NOTIFY about a type that led to a
  claim finding nothing (``missed``) make the next claim scan from the start (a *rescan*);
- the ``BehindProbe`` asks the database every ``PROBE_SECONDS``, on a connection of its own,
  for due runs behind a bound, and lowers the bound to the earliest. While notifications
  arrive (the listener is connected) it looks only at the index range the claims passed
  over since its last look, where runs skipped for another claimer's lock are; otherwise,
  and every ``FULL_PROBE_SECONDS``, from the start. Under a held snapshot the range passed
  over in a few seconds is a few seconds of runs, so the probe's cost stays flat however long
  the snapshot is held, except for the rare look from the start.
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
# A look from the start even while notifications arrive: for what no NOTIFY announces (an
# application enqueueing with a pgtick of an earlier version, a claimer's transaction that
# held runs for minutes and then rolled back).
FULL_PROBE_SECONDS = 600.0
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
        self._lowered: dict[str, datetime] = {}  # ``!due``: bounds to lower at the next claim
        # Per type, the lowest bound a claim scanned from since the probe last looked (None:
        # from the start): the range where runs another claimer held may have been skipped.
        self._passed: dict[str, datetime | None] = {}
        self.lowerings = 0  # bounds lowered to a run announced or found behind them

    def rescan(self) -> None:
        """Runs may have been put behind the bounds: scan from the start soon."""
        self._asked.set()

    def missed(self) -> None:
        """A NOTIFY said a run is due and the claim found none: it may have committed behind
        a bound (a long transaction), or another daemon took it. Scan from the start soon."""
        self._asked.set()

    def lower(self, job_type: str, run_at: datetime) -> None:
        """A run of ``job_type`` due at ``run_at`` is claimable, maybe behind the bound (a
        ``!due`` NOTIFY, or the probe found it): the next claim of the type scans from it.
        No margin: the run is known, and a run due now, announced as it is enqueued, is
        ahead of a bound already a margin below the latest run claimed, so it moves nothing."""
        with self._lock:
            current = self._lowered.get(job_type)
            if current is None or run_at < current:
                self._lowered[job_type] = run_at

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
            for job_type, low in self._lowered.items():
                current = self._lows.get(job_type)
                if current is not None and low < current:
                    self._lows[job_type] = low
                    self.lowerings += 1
            self._lowered.clear()
            for job_type, low in self._lows.items():
                passed = self._passed.get(job_type, low)
                if passed is not None:
                    self._passed[job_type] = min(passed, low)
            return dict(self._lows)

    def snapshot(self) -> tuple[dict[str, datetime], dict[str, datetime | None]]:
        """The current bounds, and what claims passed over since the last snapshot (per type,
        the lowest bound scanned from; None: from the start), for the probe."""
        with self._lock:
            passed, self._passed = self._passed, {}
            return dict(self._lows), passed

    def claimed(self, runs: Iterable[ClaimedRun]) -> None:
        """Move each type's bound up to just below the latest ``run_at`` claimed of it: the
        claim takes each type's runs in ``run_at`` order, so the ones it left are not earlier
        (those another claimer held locked are that claimer's, or the probe finds them)."""
        margin = timedelta(seconds=MARGIN_SECONDS)
        with self._lock:
            for run in runs:
                low = run.run_at - margin
                current = self._lows.get(run.job_type)
                if current is None:
                    self._passed[run.job_type] = None  # this claim scanned from the start
                if current is None or low > current:
                    self._lows[run.job_type] = low


class BehindProbe:
    """Every ``PROBE_SECONDS``: is a due run waiting behind a bound? Then lower it, now."""

    def __init__(
        self,
        store: RunStore,
        bounds: ClaimBounds,
        wake: Callable[[], None],
        metrics: Metrics,
        interval: float = PROBE_SECONDS,
        notified: Callable[[], bool] = lambda: False,
    ) -> None:
        self._store = store
        self._bounds = bounds
        self._wake = wake
        self._metrics = metrics
        self._interval = interval
        self._notified = notified  # True while NOTIFYs arrive (the listener is connected)
        self._full_at = time.monotonic()  # the first claim scanned from the start
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.found = 0  # probes that found runs behind a bound
        self.full = 0  # probes that looked from the start

    def probe(self) -> list[str]:
        """The job types with a due run behind their bound; lowers those bounds."""
        lows, passed = self._bounds.snapshot()
        if not lows:
            return []
        now = time.monotonic()
        if not self._notified() or now >= self._full_at + FULL_PROBE_SECONDS:
            froms: dict[str, datetime | None] = dict.fromkeys(lows)
            self._full_at = now
            self.full += 1
        else:
            froms = {t: passed[t] for t in lows if t in passed}
        behind = self._store.behind_bounds(lows, froms) if froms else {}
        if behind:
            self.found += 1
            log.debug("runs_behind_claim_bounds", job_types=sorted(behind))
            for job_type, run_at in behind.items():
                self._bounds.lower(job_type, run_at)
            self._wake()
        return sorted(behind)

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
