"""Where each job type's claim scan starts: the keyset claim's lower bounds.

While another session holds an old snapshot (``pg_dump``, an analytics query, a replica with
``hot_standby_feedback``), vacuum can remove no index entry of a run claimed since, and a claim
that scans ``runs_claim_idx`` from the start visits every one of them: its cost grows with the
time the snapshot is held. The claim therefore starts each type's range scan of priority 0
(the default, nearly every run) just below the ``run_at`` this daemon last claimed of it at
that priority (``MARGIN_SECONDS`` lower, for enqueues that commit a little late), so it only
visits what was consumed since. The lanes of other priorities scan from their start.

Runs can land behind a bound: enqueued due in the past or committed long after their
``run_at`` was taken (a long application transaction), recovered by the reaper with their
``run_at`` kept, given back (release), materialized or backfilled late, or skipped by a claim
because another claimer's transaction held them, which then rolled back. Each is found
without a scan from the start where it can be:

- a ``!due SECONDS JOB_TYPE`` NOTIFY (enqueue, the reaper, a release, a freed slot of a type
  with ``max_running_per_key``: its claims skip the runs of keys at their limit, so the bound
  passes a busy key's next runs) and this daemon's own release lower the type's bound to
  that second (``lower``);
- a claim of a type with a per-key rate skips the runs of keys at their rate the same way,
  and nothing announces when a window lets a key start again: one window after a run of such
  a type is claimed, the bound is put back to its ``run_at`` (``claimed``), which its key's
  next runs are not before, so a key limited to N a second is not held to one start per look
  back;
- a ``!rescan`` NOTIFY (materialization, backfill) and a NOTIFY about a type that led to a
  claim finding nothing (``missed``) make the next claim scan from the start (a *rescan*);
- every ``LOOK_SECONDS`` a claim also looks back, with a non-locking read, for due runs
  behind a bound, and the bound is lowered to the earliest (``looks``; ``claim_result`` in
  queries.sql). While notifications arrive (the listener is connected) it looks only at the
  index range the claims passed over since the last look, where runs skipped for another
  claimer's lock are; otherwise, and every ``FULL_LOOK_SECONDS``, from the start. Under a
  held snapshot the range passed over in a few seconds is a few seconds of runs, so the
  look's cost stays flat however long the snapshot is held, except for the rare look from
  the start. (It was a statement of its own, on another connection, before; inside the
  claim it costs no round trip, and the dispatcher claims what it finds at once.)

An idle dispatcher's next-due probe (``probe_lows``) starts at the latest ``run_at`` claimed,
without the margin, while notifications arrive: a run that commits behind it is announced
(its NOTIFY wakes the dispatcher, whose claim starts a margin lower), and the probe only says
how long to sleep. Under a held snapshot the margin's second of claimed runs was most of what
each probe read, every poll.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

import structlog

from pgtick.storage.store import ClaimedRun

MARGIN_SECONDS = 1.0
LOOK_SECONDS = 5.0
# A look from the start even while notifications arrive: for what no NOTIFY announces (an
# application enqueueing with a pgtick of an earlier version, a claimer's transaction that
# held runs for minutes and then rolled back).
FULL_LOOK_SECONDS = 600.0
# Rescans asked for come at most this often: under a held snapshot a scan from the start is
# the expensive kind, and a burst of NOTIFYs should not make every claim one.
MIN_RESCAN_GAP_SECONDS = 0.25
# Put-backs for a per-key rate that fall due within this fraction of its window are made
# together (at the first one's time, to the earlier run_at).
KEY_WINDOW_MERGE = 0.05

log = structlog.get_logger("pgtick.keyset")


class ClaimBounds:
    """The lower bound of each job type's claim. ``lows``, ``for_claim`` and ``claimed`` are
    the dispatcher's; ``rescan``, ``missed`` and ``lower`` may be called from any thread."""

    def __init__(self, key_windows: Mapping[str, float] | None = None) -> None:
        self._lock = threading.Lock()
        # Per type with a per-key rate, its window in seconds; and, in the order they fall
        # due, (monotonic time, run_at) of the runs claimed a window before, to put the bound
        # back to then, merged when they fall due within KEY_WINDOW_MERGE of a window.
        self._key_windows = dict(key_windows or {})
        self._put_back: dict[str, collections.deque[tuple[float, datetime]]] = {}
        self._lows: dict[str, datetime] = {}
        self._tops: dict[str, datetime] = {}  # the bounds claims set (not lowered since)
        self._last_rescan = -math.inf  # monotonic
        self._asked = threading.Event()
        self._asked.set()  # the first claim scans from the start
        self.rescans = 0  # how many scans started from the beginning
        self._lowered: dict[str, datetime] = {}  # ``!due``: bounds to lower at the next claim
        # Per type, the lowest bound a claim scanned from since the last look back (None: from
        # the start): the range where runs another claimer held may have been skipped.
        self._passed: dict[str, datetime | None] = {}
        self.look_seconds = LOOK_SECONDS  # how often a claim looks back
        self._looked_at = time.monotonic()  # the last look back
        self._full_at = time.monotonic()  # the last look from the start (the first claim's)
        # True while NOTIFYs arrive (the service sets it to the listener's state): otherwise
        # nothing announces runs put behind a bound, and every look is from the start.
        self.notifying: Callable[[], bool] = lambda: False
        self.lowerings = 0  # bounds lowered to a run announced or found behind them
        self.looks = 0  # claims that looked back
        self.full_looks = 0  # of which from the start

    def rescan(self) -> None:
        """Runs may have been put behind the bounds: scan from the start soon."""
        self._asked.set()

    def missed(self) -> None:
        """A NOTIFY said a run is due and the claim found none: it may have committed behind
        a bound (a long transaction), or another daemon took it. Scan from the start soon."""
        self._asked.set()

    def lower(self, job_type: str, run_at: datetime) -> None:
        """A run of ``job_type`` due at ``run_at`` is claimable, maybe behind the bound (a
        ``!due`` NOTIFY, or a look back found it): the next claim of the type scans from it.
        No margin: the run is known, and a run due now, announced as it is enqueued, is
        ahead of a bound already a margin below the latest run claimed, so it moves nothing."""
        with self._lock:
            current = self._lowered.get(job_type)
            if current is None or run_at < current:
                self._lowered[job_type] = run_at

    def pending(self) -> float | None:
        """Seconds until an asked-for rescan or a look back is due (None: neither): how long
        an idle dispatcher may sleep before claiming again."""
        now = time.monotonic()
        waits = []
        if self._asked.is_set():
            waits.append(self._last_rescan + MIN_RESCAN_GAP_SECONDS - now)
        with self._lock:
            for queue in self._put_back.values():
                if queue:
                    waits.append(queue[0][0] - now)
            if self._lows:  # when _look_due turns true
                look_at = self._looked_at + self.look_seconds
                if not self._passed and self.notifying():
                    look_at = max(look_at, self._full_at + FULL_LOOK_SECONDS)
                waits.append(look_at - now)
        return max(0.0, min(waits)) if waits else None

    def look_due(self) -> bool:
        """The next claim looks back (an idle dispatcher claims then, not only probes)."""
        with self._lock:
            return self._look_due(time.monotonic())

    def lows(self) -> dict[str, datetime]:
        """The bounds for the next probe or claim (empty: every type from the start)."""
        with self._lock:
            self._update(time.monotonic())
            return dict(self._lows)

    def probe_lows(self) -> dict[str, datetime]:
        """The bounds for an idle dispatcher's next-due probe: while notifications arrive, a
        bound a claim set is raised back to the ``run_at`` it was claimed at (anything committed
        behind it is announced and claimed from the lower bound); a bound lowered since, or
        any bound without notifications, is the claim's."""
        with self._lock:
            self._update(time.monotonic())
            if not self.notifying():
                return dict(self._lows)
            margin = timedelta(seconds=MARGIN_SECONDS)
            return {
                job_type: low + margin if self._tops.get(job_type) == low else low
                for job_type, low in self._lows.items()
            }

    def for_claim(self) -> tuple[dict[str, datetime], dict[str, datetime | None]]:
        """The bounds for the next claim, and, when a look back is due, per type where it
        looks from (None: from the start) up to the bound; empty: no look now."""
        now = time.monotonic()
        with self._lock:
            self._update(now)
            looks: dict[str, datetime | None] = {}
            if self._look_due(now):
                looks = self._look(now)
            return dict(self._lows), looks

    def set_key_windows(self, key_windows: Mapping[str, float]) -> None:
        """The per-key rates' windows changed at runtime (an operator's limits)."""
        with self._lock:
            self._key_windows = dict(key_windows)

    def claimed(self, runs: Iterable[ClaimedRun]) -> None:
        """Move each type's bound up to just below the latest ``run_at`` claimed of it at
        priority 0: the claim takes that lane's runs in ``run_at`` order, so the ones it left
        are not earlier (those another claimer held locked are that claimer's, or a look back
        finds them). A run of another priority says nothing about where that lane is: a
        higher one is claimed first however late it is due, and moved the bound past the
        rest of a backlog, which then waited for a look back while lower ones went first."""
        latest: dict[str, datetime] = {}
        earliest: dict[str, datetime] = {}
        for run in runs:
            if run.priority != 0:
                continue
            seen = latest.get(run.job_type)
            if seen is None or run.run_at > seen:
                latest[run.job_type] = run.run_at
            first = earliest.get(run.job_type)
            if run.job_type in self._key_windows and (first is None or run.run_at < first):
                earliest[run.job_type] = run.run_at
        if earliest:
            self._put_back_later(earliest)
        margin = timedelta(seconds=MARGIN_SECONDS)
        with self._lock:
            for job_type, run_at in latest.items():
                try:
                    low = run_at - margin
                except OverflowError:  # due in the first second of year 1: no bound below it
                    continue
                current = self._lows.get(job_type)
                if current is not None and low <= current:
                    continue
                # The bound moves past what this claim scanned from ``current`` (None: from
                # the start): a run it skipped there is behind the bound now, for a look to
                # find. A claim that moves no bound leaves its range ahead of it.
                passed = self._passed.get(job_type, current)
                self._passed[job_type] = (
                    None if passed is None or current is None else min(passed, current)
                )
                self._lows[job_type] = low
                self._tops[job_type] = low

    def _put_back_later(self, earliest: Mapping[str, datetime]) -> None:
        """One rate window from now, put each type's bound back to the earliest ``run_at`` it
        claimed now: its key may start again then, and that key's next runs are not before."""
        now = time.monotonic()
        with self._lock:
            for job_type, run_at in earliest.items():
                window = self._key_windows.get(job_type)
                if window is None:  # its per-key rate was lifted at runtime meanwhile
                    continue
                queue = self._put_back.setdefault(job_type, collections.deque())
                if queue and now + window - queue[-1][0] < window * KEY_WINDOW_MERGE:
                    queue[-1] = (queue[-1][0], min(queue[-1][1], run_at))
                else:
                    queue.append((now + window, run_at))

    def found(self, behind: dict[str, datetime]) -> None:
        """A look back found due runs behind these bounds, or in the margin above them (the
        idle probe starts at the top of the margin, so it would not see those): the next
        claim starts at them, and the next probe at the claim's bound."""
        if behind:
            log.debug("runs_behind_claim_bounds", job_types=sorted(behind))
        with self._lock:
            for job_type in behind:
                self._tops.pop(job_type, None)
        for job_type, run_at in behind.items():
            self.lower(job_type, run_at)

    def _update(self, now: float) -> None:
        """Apply an asked-for rescan (once the gap allows) and the announced lowerings."""
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
        for job_type, queue in self._put_back.items():
            while queue and queue[0][0] <= now:
                _, back = queue.popleft()
                current = self._lows.get(job_type)
                if current is not None and back < current:
                    self._lows[job_type] = back
                    self.lowerings += 1

    def _full_due(self, now: float) -> bool:
        return not self.notifying() or now >= self._full_at + FULL_LOOK_SECONDS

    def _look_due(self, now: float) -> bool:
        if not self._lows or now < self._looked_at + self.look_seconds:
            return False
        return bool(self._passed) or self._full_due(now)

    def _look(self, now: float) -> dict[str, datetime | None]:
        """Where this look back starts, per type with a bound; forgets what was passed over."""
        self._looked_at = now
        self.looks += 1
        if self._full_due(now):
            self._full_at = now
            self.full_looks += 1
            looks: dict[str, datetime | None] = dict.fromkeys(self._lows)
        else:
            looks = {t: low for t, low in self._passed.items() if t in self._lows}
        self._passed = {}
        return looks
