"""The database-derived series and ``/readyz``: what the daemon reads from PostgreSQL to show.

``DatabaseCollector`` renders the database-derived gauges from a snapshot that a caller-given
function reads with one aggregate query. Scrapes share it: at most one read per cache period
whatever the number of scrapers, and a scrape waits for it only briefly, so ``/metrics``
answers within a second even when the database hangs (with ``pgtick_db_collect_success 0``).
A scrape starts that read before it collects anything else (``prefetch``), so the query
overlaps the rest of the scrape instead of following it. Once scrapes come at a steady pace
(Prometheus's ``scrape_interval``), the read for the next one is made shortly before it is due
(``Cadence``), so that scrape finds fresh values and does not wait for the query at all: its
time no longer grows with the table, and the reads stay one per scrape.
``PoolStatsCollector`` shows the connection pools; ``Readiness`` decides ``/readyz`` from the
last read and the ticker. The series the daemon's own loops update live in ``metrics.py``.
"""

from __future__ import annotations

import itertools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RUN_STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled", "skipped")
WAITING_REASONS = ("concurrency", "rate")  # pgtick_runs_waiting: which limit holds runs back
DB_CACHE_SECONDS = 5.0  # one aggregate query per this period, whatever the number of scrapers
DB_WAIT_SECONDS = 0.8  # a scrape waits this long for a fresh read, then answers without it
# A read made ahead of an expected scrape starts this long before it, and at least this many
# times the last read's duration (so that it is done when the scrape comes), at most half a
# cache period (so that the scrape still finds it fresh).
AHEAD_MIN_SECONDS = 0.25
AHEAD_READS = 3.0
CADENCE_ROUNDS = 5  # the latest gaps between scrape rounds that give the expected next one
READY_TICK_INTERVALS = 2.0  # /readyz fails once the ticker missed this many intervals
OTHER_JOB_TYPE = "other"  # the label the job types beyond the labelled ones are summed under

log = structlog.get_logger("pgtick.metrics")


@dataclass(frozen=True)
class DatabaseSnapshot:
    """The database-derived gauges' values; keys missing here are shown as 0."""

    runs: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (job_type, status)
    queue_depth: Mapping[str, int] = field(default_factory=dict)
    oldest_due_seconds: Mapping[str, float] = field(default_factory=dict)
    stuck: Mapping[str, int] = field(default_factory=dict)
    schedule_last_success: Mapping[str, float] = field(default_factory=dict)  # Unix seconds
    schedule_next_run: Mapping[str, float] = field(default_factory=dict)  # Unix seconds
    schedules_overdue: int = 0
    terminal_counted_at: float | None = None  # Unix seconds of the terminal-state recount
    horizon_age_seconds: float = 0.0  # oldest snapshot holding the MVCC horizon (0: none)
    horizon_age_transactions: int = 0
    horizon_sessions_visible: bool = True  # False: other roles' sessions cannot be seen
    dead_tuples: Mapping[str, int] = field(default_factory=dict)  # pgtick table -> dead rows
    batches_open: Mapping[str, int] = field(default_factory=dict)  # open | closed -> batches
    waiting_after: Mapping[str, int] = field(default_factory=dict)  # job type -> runs
    waiting: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (job_type, reason)
    # Flow-control limits of this daemon's config and what they hold now, per (job_type, limit
    # name): max_running and the runs held; rate (starts per window) and the starts in it.
    limits: Mapping[tuple[str, str], float] = field(default_factory=dict)
    limits_in_use: Mapping[tuple[str, str], float] = field(default_factory=dict)


Cancel = Callable[[], None]
Timer = Callable[[float, Callable[[], None]], Cancel]  # (delay in seconds, action) -> cancel


def start_timer(delay: float, action: Callable[[], None]) -> Cancel:
    """``action`` on a thread of its own after ``delay`` seconds, unless cancelled first."""
    timer = threading.Timer(delay, action)
    timer.name = "pgtick-metrics-ahead"
    timer.daemon = True
    timer.start()
    return timer.cancel


class Cadence:
    """When scrapes come. A round is a scrape and those within one cache period after it (a
    second Prometheus, a person's curl, the bench's warm scrapes); the next round is expected
    the median gap of the latest rounds after this one. Prometheus scrapes a target at a
    fixed interval, so after two rounds the expectation is good to a few milliseconds."""

    def __init__(self, period: float) -> None:
        self._period = period
        self._starts: deque[float] = deque(maxlen=CADENCE_ROUNDS + 1)

    def scraped(self, now: float) -> float | None:
        """Note a scrape at ``now``; when it starts a round after an earlier one, the time
        the next round is expected, else None."""
        if self._starts and now - self._starts[-1] < self._period:
            return None
        self._starts.append(now)
        if len(self._starts) < 2:
            return None
        return now + statistics.median(b - a for a, b in itertools.pairwise(self._starts))


@dataclass
class DatabaseRead:
    """One read of the database, shared by every scrape that waits for it."""

    done: threading.Event = field(default_factory=threading.Event)
    snapshot: DatabaseSnapshot | None = None
    error: str | None = None
    seconds: float = 0.0


class DatabaseCollector(Collector):
    """The database-derived gauges, read through ``fetch`` at most once per cache period.

    ``fetch`` raises on failure; its message becomes the reason ``/readyz`` gives. A read runs
    on its own thread, so a scrape never waits longer than ``wait_seconds`` for it.
    """

    def __init__(
        self,
        fetch: Callable[[], DatabaseSnapshot],
        job_types: Iterable[str],
        schedules: Iterable[str],
        *,
        other_job_types: int = 20,
        on_error: Callable[[], None] | None = None,
        cache_seconds: float = DB_CACHE_SECONDS,
        wait_seconds: float = DB_WAIT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        timer: Timer = start_timer,
    ) -> None:
        self._fetch = fetch
        self._job_types = tuple(job_types)
        self._schedules = tuple(schedules)
        self._other_job_types = other_job_types
        self._on_error = on_error
        self._cache_seconds = cache_seconds
        self._wait_seconds = wait_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: DatabaseRead | None = None
        self._latest_at = -math.inf
        self._pending: DatabaseRead | None = None
        self._failing = False
        self._timer = timer
        self._cadence = Cadence(cache_seconds)
        self._cancel_ahead: Cancel | None = None
        self._plan = 0  # the latest read planned ahead; a replaced one does nothing
        self._closed = False

    def describe(self) -> list[Metric]:
        """Nothing up front: describing would otherwise run a query at registration."""
        return []

    def latest(self) -> DatabaseRead:
        """A read at most ``cache_seconds`` old, starting one if needed and waiting briefly."""
        read = self._current()
        if read.done.wait(self._wait_seconds):
            return read
        return DatabaseRead(error=f"database read still running after {self._wait_seconds:g}s")

    def prefetch(self) -> None:
        """Start a read if the cached one is too old and none is under way, without waiting
        for it. A collection calls this first (``Metrics.before_collect``), so that the query
        runs while the other series are merged and rendered, not after them; ``collect``
        then takes that same read. A scrape that starts a round also plans the read for the
        next one (``Cadence``)."""
        self._current()
        with self._lock:
            expected = self._cadence.scraped(self._clock())
            if expected is not None and not self._closed:
                self._plan_ahead(expected)

    def close(self) -> None:
        """No read ahead from now on (the daemon stops and its pool closes)."""
        with self._lock:
            self._closed = True
            cancel, self._cancel_ahead = self._cancel_ahead, None
        if cancel is not None:
            cancel()

    def _plan_ahead(self, expected: float) -> None:
        """Under the lock: read shortly before ``expected``, replacing any read planned."""
        if self._cancel_ahead is not None:
            self._cancel_ahead()
        self._plan += 1
        plan = self._plan
        last = self._latest.seconds if self._latest is not None else 0.0
        lead = min(self._cache_seconds / 2, max(AHEAD_MIN_SECONDS, AHEAD_READS * last))
        delay = max(0.0, expected - lead - self._clock())
        self._cancel_ahead = self._timer(delay, lambda: self._ahead(plan, again=True))

    def _ahead(self, plan: int, *, again: bool) -> None:
        """The planned read. If the cached one is still fresh (the gap between rounds is
        barely over a cache period), it is planned once more for the moment it is not: the
        cache period still bounds the reads, and a scrape before then is served the cache."""
        with self._lock:
            if self._closed or plan != self._plan:
                return  # stopping, or replaced by a later plan as this one fired
            self._cancel_ahead = None
            fresh_for = self._latest_at + self._cache_seconds - self._clock()
            if again and fresh_for > 0:
                self._cancel_ahead = self._timer(fresh_for, lambda: self._ahead(plan, again=False))
                return
        self._current()

    def _current(self) -> DatabaseRead:
        """The cached read if fresh, else the one under way, started here if none is."""
        with self._lock:
            latest = self._latest
            if latest is not None and self._clock() - self._latest_at < self._cache_seconds:
                return latest
            pending = self._pending
            if pending is None:
                pending = self._pending = DatabaseRead()
                threading.Thread(
                    target=self._read, args=(pending,), name="pgtick-metrics-read", daemon=True
                ).start()
            return pending

    def error(self) -> str | None:
        """Why the database-derived gauges are missing now, or None if they were read."""
        return self.latest().error

    def _read(self, read: DatabaseRead) -> None:
        started = time.perf_counter()
        try:
            read.snapshot = self._fetch()
        except Exception as exc:
            read.error = str(exc) or type(exc).__name__
        read.seconds = time.perf_counter() - started
        with self._lock:
            self._latest, self._latest_at, self._pending = read, self._clock(), None
            was_failing, self._failing = self._failing, read.error is not None
        if read.error is not None and self._on_error is not None:
            self._on_error()
        read.done.set()
        if read.error is not None and not was_failing:
            log.warning("metrics_database_read_failed", error=read.error)
        elif read.error is None and was_failing:
            log.info("metrics_database_read_recovered")

    def collect(self) -> Iterator[Metric]:
        read = self.latest()
        yield _gauge(
            "pgtick_db_collect_success",
            "0 when the database-derived gauges could not be read",
            0.0 if read.snapshot is None else 1.0,
        )
        yield _gauge(
            "pgtick_db_collect_duration_seconds", "Time the last database read took", read.seconds
        )
        if read.snapshot is not None:
            yield from self._families(read.snapshot)

    def _families(self, snap: DatabaseSnapshot) -> Iterator[Metric]:
        snap = bounded(snap, self._job_types, self._other_job_types)
        job_types = sorted(
            {*self._job_types, *(t for t, _ in snap.runs), *snap.queue_depth, *snap.stuck}
        )
        runs = GaugeMetricFamily(
            "pgtick_runs",
            "Rows per state (terminal states from a periodic recount)",
            labels=["job_type", "status"],
        )
        depth = GaugeMetricFamily(
            "pgtick_queue_depth", "Runs due now and not claimed", labels=["job_type"]
        )
        oldest = GaugeMetricFamily(
            "pgtick_queue_oldest_due_seconds",
            "Age of the oldest due, unclaimed run (0: none due)",
            labels=["job_type"],
        )
        stuck = GaugeMetricFamily(
            "pgtick_runs_stuck", "Running with an expired lease", labels=["job_type"]
        )
        for job_type in job_types:
            for status in RUN_STATUSES:
                runs.add_metric([job_type, status], snap.runs.get((job_type, status), 0))
            depth.add_metric([job_type], snap.queue_depth.get(job_type, 0))
            oldest.add_metric([job_type], snap.oldest_due_seconds.get(job_type, 0.0))
            stuck.add_metric([job_type], snap.stuck.get(job_type, 0))
        yield from (runs, depth, oldest, stuck)
        yield from _flow_families(snap, job_types)
        names = sorted({*self._schedules, *snap.schedule_last_success, *snap.schedule_next_run})
        last = GaugeMetricFamily(
            "pgtick_schedule_last_success_timestamp_seconds",
            "Last successful run's finish (0: none kept)",
            labels=["schedule"],
        )
        upcoming = GaugeMetricFamily(
            "pgtick_schedule_next_run_timestamp_seconds", "Next occurrence", labels=["schedule"]
        )
        for name in names:
            last.add_metric([name], snap.schedule_last_success.get(name, 0.0))
            upcoming.add_metric([name], snap.schedule_next_run.get(name, 0.0))
        yield from (last, upcoming)
        yield _gauge(
            "pgtick_schedules_overdue",
            "Enabled schedules whose last due occurrence has no run started",
            snap.schedules_overdue,
        )
        if snap.terminal_counted_at is not None:
            yield _gauge(
                "pgtick_runs_terminal_counted_timestamp_seconds",
                "When the terminal-state counts of pgtick_runs were last recounted",
                snap.terminal_counted_at,
            )
        yield from _vacuum_families(snap)


def _flow_families(snap: DatabaseSnapshot, job_types: Sequence[str]) -> Iterator[Metric]:
    waiting = GaugeMetricFamily(
        "pgtick_runs_waiting",
        "Due runs held back by a concurrency or rate limit (flow control)",
        labels=["job_type", "reason"],
    )
    for job_type in sorted({*job_types, *(t for t, _ in snap.waiting)}):
        for reason in WAITING_REASONS:
            waiting.add_metric([job_type, reason], snap.waiting.get((job_type, reason), 0))
    yield waiting
    limit = GaugeMetricFamily(
        "pgtick_limit",
        "A flow-control limit of this daemon's config: max_running, or rate (starts per window)",
        labels=["job_type", "limit"],
    )
    in_use = GaugeMetricFamily(
        "pgtick_limit_in_use",
        "What a flow-control limit counts now: runs held (max_running), starts in the window"
        " (rate)",
        labels=["job_type", "limit"],
    )
    for key in sorted(snap.limits):
        limit.add_metric(list(key), snap.limits[key])
        in_use.add_metric(list(key), snap.limits_in_use.get(key, 0.0))
    yield from (limit, in_use)


def _vacuum_families(snap: DatabaseSnapshot) -> Iterator[Metric]:
    yield _gauge(
        "pgtick_db_horizon_age_seconds",
        "Age of the oldest snapshot holding the MVCC horizon (sessions, replication slots, "
        "prepared transactions; 0: none)",
        snap.horizon_age_seconds,
    )
    yield _gauge(
        "pgtick_db_horizon_age_transactions",
        "Transactions since the oldest snapshot holding the MVCC horizon",
        snap.horizon_age_transactions,
    )
    yield _gauge(
        "pgtick_db_horizon_sessions_visible",
        "0 when the role cannot see other roles' session times (no pg_monitor): their age "
        "then counts from when this daemon first saw them",
        1.0 if snap.horizon_sessions_visible else 0.0,
    )
    dead = GaugeMetricFamily(
        "pgtick_table_dead_tuples", "Dead row versions in pgtick's tables", labels=["table"]
    )
    for table in sorted(snap.dead_tuples):
        dead.add_metric([table], snap.dead_tuples[table])
    yield dead
    batches = GaugeMetricFamily(
        "pgtick_batches_open",
        "Batches whose callback is not enqueued yet: open (members may be added) or closed "
        "(waiting for members to end); docs/composition.md",
        labels=["state"],
    )
    for state in ("open", "closed"):
        batches.add_metric([state], snap.batches_open.get(state, 0))
    yield batches
    waiting = GaugeMetricFamily(
        "pgtick_runs_waiting_dependency",
        "Queued runs of schedules with after waiting for another schedule's occurrence",
        labels=["job_type"],
    )
    for job_type in sorted(snap.waiting_after):
        waiting.add_metric([job_type], snap.waiting_after[job_type])
    yield waiting


def bounded(snap: DatabaseSnapshot, configured: Iterable[str], others: int) -> DatabaseSnapshot:
    """The snapshot with its job types bounded: the configured ones and the ``others``
    busiest of the rest (most non-terminal runs, then most runs, then by name) keep their
    name; every other job type is summed into ``OTHER_JOB_TYPE`` (its oldest due run is the
    oldest of them). The series count then stays bounded whatever types get enqueued."""
    keep = set(configured)
    seen = {*(t for t, _ in snap.runs), *snap.queue_depth, *snap.stuck}
    extra = seen - keep
    if len(extra) <= others:
        return snap
    active: dict[str, int] = {}
    total: dict[str, int] = {}
    for (job_type, status), n in snap.runs.items():
        total[job_type] = total.get(job_type, 0) + n
        if status in ("queued", "running", "failed"):
            active[job_type] = active.get(job_type, 0) + n
    ranked = sorted(extra, key=lambda t: (-active.get(t, 0), -total.get(t, 0), t))
    keep.update(ranked[:others])

    def label(job_type: str) -> str:
        return job_type if job_type in keep else OTHER_JOB_TYPE

    runs: dict[tuple[str, str], int] = {}
    for (job_type, status), n in snap.runs.items():
        key = (label(job_type), status)
        runs[key] = runs.get(key, 0) + n
    depth: dict[str, int] = {}
    for job_type, n in snap.queue_depth.items():
        depth[label(job_type)] = depth.get(label(job_type), 0) + n
    stuck: dict[str, int] = {}
    for job_type, n in snap.stuck.items():
        stuck[label(job_type)] = stuck.get(label(job_type), 0) + n
    oldest: dict[str, float] = {}
    for job_type, seconds in snap.oldest_due_seconds.items():
        oldest[label(job_type)] = max(seconds, oldest.get(label(job_type), 0.0))
    return replace(snap, runs=runs, queue_depth=depth, stuck=stuck, oldest_due_seconds=oldest)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


# psycopg_pool get_stats() keys: current values become gauges, running totals counters.
_POOL_GAUGES = {
    "pool_min": ("pgtick_db_pool_min_connections", "Pool minimum size"),
    "pool_max": ("pgtick_db_pool_max_connections", "Pool maximum size"),
    "pool_size": ("pgtick_db_pool_connections", "Connections open or being opened"),
    "pool_available": ("pgtick_db_pool_available_connections", "Idle connections in the pool"),
    "requests_waiting": ("pgtick_db_pool_requests_waiting", "Callers waiting for a connection"),
}
_POOL_COUNTERS = {
    "requests_num": ("pgtick_db_pool_requests", "Connections requested", 1.0),
    "requests_queued": ("pgtick_db_pool_requests_queued", "Requests that had to wait", 1.0),
    "requests_wait_ms": (
        "pgtick_db_pool_requests_wait_seconds",
        "Time spent waiting for a connection",
        0.001,
    ),
    "requests_errors": ("pgtick_db_pool_requests_errors", "Requests that failed", 1.0),
    "returns_bad": ("pgtick_db_pool_returns_bad", "Connections returned broken", 1.0),
    "connections_num": ("pgtick_db_pool_connection_attempts", "Connection attempts", 1.0),
    "connections_errors": (
        "pgtick_db_pool_connection_errors",
        "Failed connection attempts",
        1.0,
    ),
    "connections_lost": ("pgtick_db_pool_connections_lost", "Connections found broken", 1.0),
}


class PoolStatsCollector(Collector):
    """Connection pool statistics (psycopg_pool ``get_stats()``) per named pool."""

    def __init__(self, pools: Mapping[str, Callable[[], Mapping[str, int]]]) -> None:
        self._pools = dict(pools)

    def collect(self) -> Iterator[Metric]:
        stats = {name: get_stats() for name, get_stats in self._pools.items()}
        for key, (name, documentation) in _POOL_GAUGES.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["pool"])
            for pool, values in stats.items():
                gauge.add_metric([pool], values.get(key, 0))
            yield gauge
        for key, (name, documentation, scale) in _POOL_COUNTERS.items():
            counter = CounterMetricFamily(name, documentation, labels=["pool"])
            for pool, values in stats.items():
                counter.add_metric([pool], values.get(key, 0) * scale)
            yield counter


class Readiness:
    """``/readyz``: ready while the database answers and the ticker ticked recently."""

    def __init__(
        self,
        database: DatabaseCollector,
        last_tick_at: Callable[[], float | None],
        tick_interval_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        problem: Callable[[], str | None] | None = None,
    ) -> None:
        self._database = database
        self._last_tick_at = last_tick_at
        self._limit = READY_TICK_INTERVALS * tick_interval_seconds
        self._clock = clock
        self._problem = problem  # the daemon's own reason not to be ready, if any

    def reason_not_ready(self) -> str | None:
        """None when ready, else one line saying why not."""
        problem = None if self._problem is None else self._problem()
        if problem is not None:
            return problem
        error = self._database.error()
        if error is not None:
            return f"database: {error}"
        last = self._last_tick_at()
        if last is None:
            return "ticker: no tick yet"
        age = self._clock() - last
        if age > self._limit:
            return f"ticker: last tick {age:.0f}s ago (limit {self._limit:g}s)"
        return None
