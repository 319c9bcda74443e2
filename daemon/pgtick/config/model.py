"""The typed configuration the rest of the daemon receives: frozen dataclasses, one per section,
values already checked and in their units (seconds); ``Config()`` is what an empty file means.
Their defaults are the constants of ``schema``, the same ones its table documents.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pgtick.config.schema import (
    DEFAULT_AFTER_DEADLINE_SECONDS,
    DEFAULT_AFTER_MISSED,
    DEFAULT_BACKOFF,
    DEFAULT_BACKOFF_BASE_SECONDS,
    DEFAULT_BACKOFF_MAX_SECONDS,
    DEFAULT_CATCHUP,
    DEFAULT_CATCHUP_LIMIT,
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_JITTER_FRACTION,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_LOG_FORMAT,
    DEFAULT_LOG_JOB_OUTPUT,
    DEFAULT_LOG_LEVEL,
    DEFAULT_LOOKAHEAD_SECONDS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_MEMORY_MIB,
    DEFAULT_MAX_RUNS_PER_PROCESS,
    DEFAULT_METRICS_LISTEN,
    DEFAULT_ON_PAUSE,
    DEFAULT_OTHER_JOB_TYPES,
    DEFAULT_OUTPUT_MAX_BYTES,
    DEFAULT_OVERLAP,
    DEFAULT_POLL_INTERVAL_SECONDS,
    DEFAULT_POOL_SIZE,
    DEFAULT_PREFETCH,
    DEFAULT_PRIORITY,
    DEFAULT_PROCESSES,
    DEFAULT_REAPER_INTERVAL_SECONDS,
    DEFAULT_RETAIN_AUDIT_SECONDS,
    DEFAULT_RETAIN_CANCELLED_SECONDS,
    DEFAULT_RETAIN_DEAD_SECONDS,
    DEFAULT_RETAIN_SKIPPED_SECONDS,
    DEFAULT_RETAIN_SUCCEEDED_SECONDS,
    DEFAULT_SCHEDULE_JITTER_SECONDS,
    DEFAULT_SCHEMA,
    DEFAULT_SERVICE,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    DEFAULT_THREADS,
    DEFAULT_TICK_INTERVAL_SECONDS,
    DEFAULT_TIMEZONE,
    DEFAULT_TRACING_ENABLED,
    DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS,
    DEFAULT_WEB_HOSTS,
    DEFAULT_WEB_LISTEN,
    DEFAULT_WEB_PUBLIC_READS,
    DEFAULT_WEB_SESSION_TTL_SECONDS,
    DEFAULT_WEB_TOKEN_FILE,
    DEFAULT_WEB_VIEWER_TOKEN_FILE,
)
from pgtick.config.values import AUTO, Rate, cpus_available, split_listen
from pgtick.observability.redact import redact_dsn

# The package re-exports these (``from pgtick.config import Config``).
__all__ = [
    "Config",
    "DatabaseConfig",
    "JobTypeConfig",
    "LoggingConfig",
    "MetricsConfig",
    "Rate",
    "RetentionConfig",
    "ScheduleConfig",
    "TickerConfig",
    "TracingConfig",
    "WebConfig",
    "WorkerConfig",
]


@dataclass(frozen=True, repr=False)
class DatabaseConfig:
    """Where the database is; ``repr`` hides the DSN's password so a logged config leaks nothing."""

    dsn: str | None = None
    dsn_file: str | None = None
    schema: str = DEFAULT_SCHEMA
    pool_size: int = DEFAULT_POOL_SIZE
    # A direct (unpooled) DSN for the LISTEN connection when ``dsn`` goes through a
    # transaction-mode pooler; "" means ``dsn``.
    listen_dsn: str = ""
    # Prepare the worker pool's hot statements on the server (faster) on a direct connection;
    # through a pooler the daemon detects, off whatever this says (service.py).
    prepared_statements: bool = True

    def __repr__(self) -> str:
        dsn = None if self.dsn is None else redact_dsn(self.dsn)
        listen_dsn = redact_dsn(self.listen_dsn) if self.listen_dsn else ""
        return (
            f"DatabaseConfig(dsn={dsn!r}, dsn_file={self.dsn_file!r}, "
            f"schema={self.schema!r}, pool_size={self.pool_size!r}, listen_dsn={listen_dsn!r}, "
            f"prepared_statements={self.prepared_statements!r})"
        )


@dataclass(frozen=True)
class WorkerConfig:
    """The worker pool.

    ``heartbeat_seconds`` defaults to a third of the lease when only ``worker.lease`` is set;
    ``prefetch`` bounds how many runs may be claimed beyond free threads while there is a
    backlog of short runs (the worker claims fewer the longer its handlers take).
    """

    threads: int = DEFAULT_THREADS
    processes: int | str = DEFAULT_PROCESSES  # or "auto": see ``process_count``
    max_runs_per_process: int = DEFAULT_MAX_RUNS_PER_PROCESS
    max_memory_mib: int = DEFAULT_MAX_MEMORY_MIB
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    imports: tuple[str, ...] = ()
    prefetch: int = DEFAULT_PREFETCH
    refuse_undeclared_job_types: bool = False
    service: str = DEFAULT_SERVICE

    @property
    def process_count(self) -> int:
        """Worker processes to run on this machine ("auto": one per CPU it may use)."""
        return cpus_available() if self.processes == AUTO else int(self.processes)


@dataclass(frozen=True)
class TickerConfig:
    """How often schedules are materialized, how far ahead, and how often stuck runs are reaped."""

    interval_seconds: float = DEFAULT_TICK_INTERVAL_SECONDS
    lookahead_seconds: float = DEFAULT_LOOKAHEAD_SECONDS
    reaper_interval_seconds: float = DEFAULT_REAPER_INTERVAL_SECONDS


class _Listener:
    """What a ``listen = "host:port"`` key means; ``""`` disables the server."""

    listen: str

    @property
    def enabled(self) -> bool:
        """Whether the HTTP server should start at all."""
        return self.listen != ""

    @property
    def host(self) -> str:
        """The address to bind, without IPv6 brackets (only when ``enabled``)."""
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        """The TCP port to bind, 0 = any free one (only when ``enabled``)."""
        return split_listen(self.listen)[1]


@dataclass(frozen=True)
class MetricsConfig(_Listener):
    """The metrics/health HTTP listener."""

    listen: str = DEFAULT_METRICS_LISTEN
    other_job_types: int = DEFAULT_OTHER_JOB_TYPES


@dataclass(frozen=True)
class WebConfig(_Listener):
    """The web console's listener; ``token_file`` enables the operators' login (and the
    actions), ``viewer_token_file`` the viewers' (read-only)."""

    listen: str = DEFAULT_WEB_LISTEN
    token_file: str = DEFAULT_WEB_TOKEN_FILE
    viewer_token_file: str = DEFAULT_WEB_VIEWER_TOKEN_FILE
    session_ttl_seconds: float = DEFAULT_WEB_SESSION_TTL_SECONDS
    hosts: tuple[str, ...] = DEFAULT_WEB_HOSTS
    public_reads: bool = DEFAULT_WEB_PUBLIC_READS
    horizon_threshold_seconds: float = DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS


@dataclass(frozen=True)
class LoggingConfig:
    """Log shape and threshold; ``auto`` means console on a TTY, JSON lines otherwise."""

    format: str = DEFAULT_LOG_FORMAT
    level: str = DEFAULT_LOG_LEVEL
    job_output: bool = DEFAULT_LOG_JOB_OUTPUT


@dataclass(frozen=True)
class TracingConfig:
    """Spans of attempts (docs/tracing.md); the exporter is configured by the OTEL_* environment."""

    enabled: bool = DEFAULT_TRACING_ENABLED


@dataclass(frozen=True)
class RetentionConfig:
    """How long terminal runs are kept, per final state, before the daemon prunes them."""

    succeeded_seconds: float = DEFAULT_RETAIN_SUCCEEDED_SECONDS
    dead_seconds: float = DEFAULT_RETAIN_DEAD_SECONDS
    cancelled_seconds: float = DEFAULT_RETAIN_CANCELLED_SECONDS
    skipped_seconds: float = DEFAULT_RETAIN_SKIPPED_SECONDS
    audit_seconds: float = DEFAULT_RETAIN_AUDIT_SECONDS  # the audit log's, not a run status

    def by_status(self) -> dict[str, float]:
        """The retention of each terminal status, in the order retention prunes them."""
        return {
            "succeeded": self.succeeded_seconds,
            "dead": self.dead_seconds,
            "cancelled": self.cancelled_seconds,
            "skipped": self.skipped_seconds,
        }


@dataclass(frozen=True)
class JobTypeConfig:
    """One job type: its handler and retry policy.

    ``handler`` and ``command`` are both None for types registered with ``@pgtick.job`` in
    ``worker.imports``; ``lease_seconds`` None means ``worker.lease``; ``timeout_seconds`` None
    means no limit.
    """

    name: str
    handler: str | None = None
    command: tuple[str, ...] | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: str = DEFAULT_BACKOFF
    backoff_base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    backoff_max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS
    jitter: float = DEFAULT_JITTER_FRACTION
    timeout_seconds: float | None = None
    lease_seconds: float | None = None
    output_max_bytes: int = DEFAULT_OUTPUT_MAX_BYTES
    priority: int = DEFAULT_PRIORITY
    max_running: int | None = None
    concurrency_key: tuple[str, ...] | None = None  # the payload field's path
    max_running_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None
    result_from_stdout: bool = False  # commands: the last line of stdout is the result
    # Chains (docs/composition.md): what to enqueue when a run of this type ends, by
    # outcome; lists of steps {"job_type": ..., "payload": {...}, "on_success": ...}.
    on_success: Any = None
    on_dead: Any = None

    @property
    def follow(self) -> dict[str, Any] | None:
        """The chain of this type's runs in its stored form (None: none)."""
        follow = {k: v for k, v in (("on_success", self.on_success), ("on_dead", self.on_dead))}
        return {k: v for k, v in follow.items() if v} or None


@dataclass(frozen=True)
class ScheduleConfig:
    """One ``[schedules.NAME]`` entry; ``max_attempts`` None means the job type's.

    ``payload`` is a plain dict of JSON values (not a read-only proxy) so that ``json.dumps`` and
    psycopg's ``Jsonb`` take it as it is.
    """

    name: str
    job_type: str
    cron: str
    timezone: str = DEFAULT_TIMEZONE
    payload: Mapping[str, Any] = field(default_factory=dict)
    catchup: str = DEFAULT_CATCHUP
    catchup_limit: int = DEFAULT_CATCHUP_LIMIT
    overlap: str = DEFAULT_OVERLAP
    on_pause: str = DEFAULT_ON_PAUSE
    jitter_seconds: float = DEFAULT_SCHEDULE_JITTER_SECONDS
    max_attempts: int | None = None
    priority: int | None = None  # None: the job type's
    on_success: Any = None  # chain steps of its runs (None: the job type's)
    on_dead: Any = None
    after: str | None = None  # the schedule whose occurrence each of its runs waits for
    after_deadline_seconds: float = DEFAULT_AFTER_DEADLINE_SECONDS
    after_missed: str = DEFAULT_AFTER_MISSED

    @property
    def after_on(self) -> dict[str, Any] | None:
        """``after`` as the schedules table stores it (None: none)."""
        if self.after is None:
            return None
        return {
            "schedule": self.after,
            "deadline_seconds": self.after_deadline_seconds,
            "missed": self.after_missed,
        }

    @property
    def follow(self) -> dict[str, Any] | None:
        """The chain of its runs in its stored form (None: its job type's)."""
        follow = {"on_success": self.on_success, "on_dead": self.on_dead}
        return {k: v for k, v in follow.items() if v} or None


def _empty_job_types() -> Mapping[str, JobTypeConfig]:
    return types.MappingProxyType({})


def _empty_schedules() -> Mapping[str, ScheduleConfig]:
    return types.MappingProxyType({})


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``Config()`` is what an empty file means."""

    database: DatabaseConfig = field(default_factory=DatabaseConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    ticker: TickerConfig = field(default_factory=TickerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    web: WebConfig = field(default_factory=WebConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    job_types: Mapping[str, JobTypeConfig] = field(default_factory=_empty_job_types)
    schedules: Mapping[str, ScheduleConfig] = field(default_factory=_empty_schedules)
    path: str | None = None

    def job_type(self, name: str) -> JobTypeConfig:
        """The configured job type, or the defaults for one known only from a decorator."""
        configured = self.job_types.get(name)
        return configured if configured is not None else JobTypeConfig(name=name)
