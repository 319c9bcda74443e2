"""The process-local Prometheus series on a dedicated registry.

``Metrics`` holds the series the daemon's own loops update; label values are pre-initialised
for every configured job type so series never vanish. Per-run updates go through cached label
children: the hot path is a dict lookup and an increment. What the handler threads would
update for every run is kept off their path: the busy-thread gauge is read from the lifecycle
when collected, and start delays are queued and observed by one thread at a time (``flush``:
the result writer after each batch, and every collection), because each Prometheus update
takes a lock, and eight threads contending for the same few locks cost a drain of no-op runs
about a tenth of its throughput (measured, docs/performance.md). The database-derived series
and ``/readyz`` live in ``database.py``.

With ``worker.processes`` above 1 every process of the daemon keeps its series in files of one
private directory (prometheus_client's multiprocess mode, ``multiprocess_dir``) and the
supervisor's ``/metrics`` reads them all, summed: each series once, a counter of a worker
process that died kept (its file stays), the gauges of one that died dropped
(``process_gone``). Gauges say how processes combine (``multiprocess_mode``; ignored in one
process). The supervisor's own process series (``process_*``) are its own only; each worker
process's resident memory is ``pgtick_worker_process_resident_memory_bytes`` by pid.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    multiprocess,
    values,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from pgtick.observability.multiproc import MergedFiles
from pgtick.observability.outage import DatabaseOutage

ATTEMPT_OUTCOMES = ("succeeded", "failed", "lost", "cancelled", "released")
# The daemon's database operations, pre-initialised so a dashboard shows 0, not "no data",
# until the first error; an operation missing here still gets its series on first use.
DB_OPERATIONS = ("claim", "complete", "heartbeat", "listen", "metrics", "reap", "release", "tick")

DURATION_BUCKETS_SECONDS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
START_DELAY_BUCKETS_SECONDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

# A claim's round trip: under a millisecond idle, a few with a backlog (a claim of 264 runs
# takes 5-10 ms on a 2-core machine), and what a held snapshot or bloat adds on top. Fine
# steps below 25 ms, so that a p99 read from them (histogram_quantile) moves with the claim
# rather than with the bucket it falls in.
CLAIM_BUCKETS_SECONDS = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.0015,
    0.002,
    0.0025,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class _First(Collector):
    """Registered first, so that every collection (a scrape, ``get_sample_value``) runs
    ``first`` before any series is read: the ``before_collect`` hooks (the database read
    started, to run while the rest is collected), then the queued observations applied."""

    def __init__(self, first: Callable[[], None]) -> None:
        self._first = first

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        self._first()
        return iter(())


class Metrics:
    """The process-local series; one instance per daemon."""

    def __init__(
        self,
        job_types: Iterable[str],
        version: str,
        threads: int,
        *,
        multiprocess_dir: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = multiprocess_dir
        self._before_collect: list[Callable[[], None]] = []
        # (job type, start delay) of runs started since the last flush.
        self._pending_delays: collections.deque[tuple[str, float]] = collections.deque()
        self.registry.register(_First(self._collect_first))
        r = self.registry
        if multiprocess_dir is not None:
            # Values go to this process's files (MultiProcessValue, chosen here rather than at
            # import: the supervisor decides after reading its config); the series objects sit
            # on a registry of their own, never exposed, and the exposed one reads every
            # process's files.
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiprocess_dir
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
            r = CollectorRegistry(auto_describe=True)
            self.registry.register(MergedFiles(multiprocess_dir))
        # The loops count their database errors here and tell an outage through this.
        self.outage = DatabaseOutage()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.job_types = tuple(job_types)
        self.attempts = Counter(
            "pgtick_run_attempts",
            "Attempts finished by this daemon",
            ["job_type", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "pgtick_run_duration_seconds",
            "Handler wall time",
            ["job_type", "outcome"],
            buckets=DURATION_BUCKETS_SECONDS,
            registry=r,
        )
        self.start_delay = Histogram(
            "pgtick_run_start_delay_seconds",
            "Start minus run_at",
            ["job_type"],
            buckets=START_DELAY_BUCKETS_SECONDS,
            registry=r,
        )
        # Observed by the dispatcher alone, once per claim (a claim takes up to a few hundred
        # runs): its lock is never contended.
        self.claim_duration = Histogram(
            "pgtick_claim_duration_seconds",
            "Claim statements' round trip as this daemon sees it, whether or not they found runs",
            buckets=CLAIM_BUCKETS_SECONDS,
            registry=r,
        )
        self.leases_lost = Counter(
            "pgtick_leases_lost", "Heartbeats that found the lease gone", ["job_type"], registry=r
        )
        self.db_errors = Counter(
            "pgtick_db_errors", "Database errors seen", ["operation"], registry=r
        )
        self.worker_threads = Gauge(
            "pgtick_worker_threads", "Worker pool size", registry=r, multiprocess_mode="livesum"
        )
        self.busy_threads = Gauge(
            "pgtick_worker_busy_threads", "Workers in use", registry=r, multiprocess_mode="livesum"
        )
        self.draining = Gauge(
            "pgtick_draining", "1 while shutting down", registry=r, multiprocess_mode="livemax"
        )
        self.last_tick = Gauge(
            "pgtick_ticker_last_tick_timestamp_seconds",
            "Liveness of the ticker",
            registry=r,
            multiprocess_mode="max",
        )
        self.process_memory = Gauge(
            "pgtick_worker_process_resident_memory_bytes",
            "Resident memory of each worker process (worker.processes above 1)",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.job_type_paused = Gauge(
            "pgtick_job_type_paused",
            "1 while the job type is paused fleet-wide (pgtick pause), as this daemon last read it",
            ["job_type"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.build_info = Gauge(
            "pgtick_build_info", "Always 1", ["version"], registry=r, multiprocess_mode="max"
        )
        self.build_info.labels(version).set(1)
        self.worker_threads.set(threads)
        self._attempts: dict[tuple[str, str], Counter] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}
        self._delays: dict[str, Histogram] = {}
        for operation in DB_OPERATIONS:
            self.db_errors.labels(operation)
        for job_type in self.job_types:
            self.leases_lost.labels(job_type)
            self.start_delay.labels(job_type)
            self.job_type_paused.labels(job_type).set(0)
            for outcome in ATTEMPT_OUTCOMES:
                self.attempts.labels(job_type, outcome)
                self.duration.labels(job_type, outcome)

    def attempts_finished(
        self, job_type: str, outcome: str, seconds: Sequence[float | None]
    ) -> None:
        """Attempts of one job type and outcome that ended, one handler time each (None: no
        handler ran, nothing observed): one counter increment for all of them."""
        key = (job_type, outcome)
        counter = self._attempts.get(key)
        if counter is None:
            counter = self._attempts[key] = self.attempts.labels(job_type, outcome)
            self._durations[key] = self.duration.labels(job_type, outcome)
        counter.inc(len(seconds))
        histogram = self._durations[key]
        for value in seconds:
            if value is not None:
                histogram.observe(value)

    def before_collect(self, hook: Callable[[], None]) -> None:
        """Have every collection call ``hook`` before it reads any series (the endpoints: the
        database read started, so that its query overlaps the merge and the rendering)."""
        self._before_collect.append(hook)

    def _collect_first(self) -> None:
        for hook in self._before_collect:
            hook()
        self.flush()

    def run_started(self, job_type: str, delay_seconds: float) -> None:
        """Queue a run's start delay (an append takes no lock); ``flush`` observes it."""
        self._pending_delays.append((job_type, delay_seconds))

    def flush(self) -> None:
        """Observe the queued start delays. Any thread may call it at any time: each queued
        value is taken by exactly one caller (the deque's pops are atomic)."""
        pending = self._pending_delays
        while pending:
            try:
                job_type, delay = pending.popleft()
            except IndexError:
                return
            histogram = self._delays.get(job_type)
            if histogram is None:
                histogram = self._delays[job_type] = self.start_delay.labels(job_type)
            histogram.observe(max(0.0, delay))

    def paused(self, job_types: Iterable[str], paused: frozenset[str]) -> None:
        """Which of ``job_types`` are paused now (the dispatcher, when it reads controls)."""
        for job_type in job_types:
            self.job_type_paused.labels(job_type).set(1 if job_type in paused else 0)

    def claimed(self, seconds: float) -> None:
        """One claim statement's round trip (the dispatcher's thread)."""
        self.claim_duration.observe(seconds)

    def count_busy(self, busy: Callable[[], float]) -> None:
        """The busy-thread gauge reads ``busy`` when collected, rather than being set twice
        per run by the threads."""
        self.busy_threads.set_function(busy)

    def sample_process(self, busy: int, rss_bytes: int | None) -> None:
        """A worker process's own gauges, set once a second (multiprocess mode reads files,
        where a gauge read when collected, as ``count_busy`` makes it, cannot be)."""
        self.busy_threads.set(busy)
        if rss_bytes is not None:
            self.process_memory.set(rss_bytes)

    def process_gone(self, pid: int) -> None:
        """The supervisor: a worker process ended; its live gauges go (its counters stay)."""
        if self.multiprocess_dir is not None:
            multiprocess.mark_process_dead(pid, self.multiprocess_dir)  # type: ignore[no-untyped-call]

    def lease_lost(self, job_type: str) -> None:
        self.leases_lost.labels(job_type).inc()

    def db_error(self, operation: str) -> None:
        self.db_errors.labels(operation).inc()

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        """The registry in the text format the scraper asked for (OpenMetrics or Prometheus)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type
