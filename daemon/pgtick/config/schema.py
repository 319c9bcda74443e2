"""The config schema: every key of the file in one declarative table (``KEYS``): where it lives,
the dataclass field it fills, its type, its default, one line of documentation and the checker
that validates it. The loader is driven by this table, and the config reference can be
generated from it (``config.example.toml`` says the same, by hand, today).

Defaults are named constants with their unit; the dataclasses of ``model`` use the same
constants, and a test checks that the table and the dataclasses agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from pgtick.config.values import (
    DAY_SECONDS,
    HOUR_SECONDS,
    Checker,
    byte_size,
    chain_steps,
    choice,
    command,
    duration,
    flag,
    fraction,
    handler,
    host_names,
    imports,
    integer,
    job_type_ref,
    listen,
    optional_path,
    optional_string,
    payload,
    payload_field,
    process_count,
    rate,
    schema,
    string,
)

# -- Defaults, with their units --------------------------------------------------------------------

DEFAULT_SCHEMA = "pgtick"
DEFAULT_POOL_SIZE = 10
# Every pooled connection counts against the server's max_connections (100 by default); more
# than this is a typo, and `pgtick run` also checks the pool against the server it meets.
MAX_POOL_SIZE = 1000

DEFAULT_THREADS = 8
MAX_THREADS = 1024
# Worker processes per daemon: one per CPU the unit may use, so that a bigger VM does more
# (docs/architecture.md, "The default's trade-off": each brings its own connections).
DEFAULT_PROCESSES = "auto"
MAX_PROCESSES = 256
# Recycling of worker processes (0: never): after this many finished runs, or this RSS.
DEFAULT_MAX_RUNS_PER_PROCESS = 0
DEFAULT_MAX_MEMORY_MIB = 0
DEFAULT_LEASE_SECONDS = 60.0
# A shorter lease expires while a healthy run waits for its heartbeat's round trip.
MIN_LEASE_SECONDS = 1.0
# A job type's lease spans at least this many heartbeats, so one late beat does not lose it.
MIN_LEASE_HEARTBEATS = 2
# Three renewals per lease: one lost heartbeat does not lose the run.
DEFAULT_HEARTBEAT_SECONDS = DEFAULT_LEASE_SECONDS / 3
DEFAULT_POLL_INTERVAL_SECONDS = 5.0
DEFAULT_SHUTDOWN_GRACE_SECONDS = 30.0
DEFAULT_PREFETCH = 256  # an upper bound: see Worker.prefetch_now
# The service a daemon belongs to: its config sync owns this service's schedules only.
DEFAULT_SERVICE = "default"
MAX_PREFETCH = 1024

DEFAULT_TICK_INTERVAL_SECONDS = 60.0
DEFAULT_LOOKAHEAD_SECONDS = 60.0
# Runs are created this far ahead to start on time; an hour is already plenty, and every
# second more is rows written in one tick (a year of a minutely schedule is 525 600).
MAX_LOOKAHEAD_SECONDS = HOUR_SECONDS
DEFAULT_REAPER_INTERVAL_SECONDS = 10.0

DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
# Job types the config does not name, labelled by name in the database-derived series (the
# busiest first); the rest are summed under job_type="other", so whoever enqueues cannot
# multiply the series (about 10 per job type on every daemon).
DEFAULT_OTHER_JOB_TYPES = 20
MAX_OTHER_JOB_TYPES = 1000
DEFAULT_WEB_LISTEN = ""  # the console is off unless asked for
DEFAULT_WEB_TOKEN_FILE = ""
DEFAULT_WEB_VIEWER_TOKEN_FILE = ""
DEFAULT_WEB_SESSION_TTL_SECONDS = 12 * HOUR_SECONDS
MAX_WEB_SESSION_TTL_SECONDS = 30 * DAY_SECONDS
DEFAULT_WEB_HOSTS: tuple[str, ...] = ()
DEFAULT_WEB_PUBLIC_READS = False
# The banner's threshold for a snapshot holding the MVCC horizon: `pgtick status
# --horizon-threshold`'s default, the PgtickVacuumBlocked alert's.
DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS = 15 * 60.0

LOG_FORMATS = ("auto", "json", "console")
DEFAULT_LOG_FORMAT = "auto"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
DEFAULT_LOG_JOB_OUTPUT = True
DEFAULT_TRACING_ENABLED = False  # spans cost an export per attempt: asked for, never assumed

DEFAULT_RETAIN_SUCCEEDED_SECONDS = 7 * DAY_SECONDS
DEFAULT_RETAIN_DEAD_SECONDS = 30 * DAY_SECONDS
DEFAULT_RETAIN_CANCELLED_SECONDS = 7 * DAY_SECONDS
DEFAULT_RETAIN_SKIPPED_SECONDS = 1 * DAY_SECONDS
DEFAULT_RETAIN_AUDIT_SECONDS = 90 * DAY_SECONDS

DEFAULT_MAX_ATTEMPTS = 10
BACKOFFS = ("exponential", "linear", "fixed")
DEFAULT_BACKOFF = "exponential"
DEFAULT_BACKOFF_BASE_SECONDS = 10.0
DEFAULT_BACKOFF_MAX_SECONDS = 1 * HOUR_SECONDS
DEFAULT_JITTER_FRACTION = 0.2  # ±20 % of the delay
# What an attempt printed is kept up to this many bytes: half the head, half the tail.
DEFAULT_OUTPUT_MAX_BYTES = 64 * 1024
MIN_OUTPUT_MAX_BYTES = 1024
MAX_OUTPUT_MAX_BYTES = 16 * 1024 * 1024

# Priorities are integers either side of 0 (the default); beyond a million is a typo.
DEFAULT_PRIORITY = 0
MAX_PRIORITY = 1_000_000

DEFAULT_TIMEZONE = "UTC"
CATCHUPS = ("latest", "all", "none")
DEFAULT_CATCHUP = "latest"
DEFAULT_CATCHUP_LIMIT = 100  # Kubernetes CronJob's figure
OVERLAPS = ("skip", "allow")
DEFAULT_OVERLAP = "skip"
# What a schedule does while its job type is paused (pgtick pause): hold materializes its
# occurrences as queued runs that start after the resume; skip records them as skipped.
ON_PAUSE = ("hold", "skip")
DEFAULT_ON_PAUSE = "hold"
AFTER_MISSED = ("skip", "run")
DEFAULT_AFTER_MISSED = "skip"
DEFAULT_AFTER_DEADLINE_SECONDS = 3600.0
DEFAULT_SCHEDULE_JITTER_SECONDS = 0.0

# -- The keys --------------------------------------------------------------------------------------

# The tables keys live in: the sections, and the per-name tables.
DATABASE, WORKER, TICKER, METRICS, WEB = "database", "worker", "ticker", "metrics", "web"
LOGGING, RETENTION, TRACING = "logging", "retention", "tracing"
JOB_TYPE_TABLE, SCHEDULE_TABLE = "job_types.NAME", "schedules.NAME"
JOB, SCHEDULE = JOB_TYPE_TABLE, SCHEDULE_TABLE

# Kinds of value as the reference names them; a duration fills the field ``<key>_seconds``.
DURATION = "duration"
DURATION_OR_ZERO = "duration, 0s allowed"
INT_POSITIVE = "integer >= 1"
LISTEN = '"host:port", or "" for off'
_SECONDS = duration()
_SECONDS_OR_ZERO = duration(allow_zero=True)
_LEASE = duration(
    low=MIN_LEASE_SECONDS,
    why="a shorter lease expires while a healthy run waits for its heartbeat",
)


@dataclass(frozen=True)
class Key:
    """One key of the config file.

    ``table`` is the section (``worker``) or the per-name table (``job_types.NAME``); ``kind``
    its type as the reference names it; ``default`` the value leaving it out means (in the
    field's unit, seconds for durations; None: none); ``check`` turns the raw TOML value into
    that type or raises a ConfigError naming the key.
    """

    table: str
    name: str
    kind: str
    default: object
    check: Checker
    doc: str
    required: bool = False

    @property
    def field(self) -> str:
        """The attribute of the table's dataclass this key fills."""
        return f"{self.name}_seconds" if self.kind in (DURATION, DURATION_OR_ZERO) else self.name


# fmt: off
KEYS: tuple[Key, ...] = (
    # Key(table, key, kind, default, check,
    #     doc, [required])
    Key(DATABASE, "dsn", "string", None, string,
        "where PostgreSQL is; --dsn > $PGTICK_DSN > database.dsn > database.dsn_file"),
    Key(DATABASE, "dsn_file", "file path", None, string,
        "a file holding the DSN (systemd LoadCredential=); set dsn or dsn_file, not both"),
    Key(DATABASE, "listen_dsn", 'string, or "" for dsn', "", optional_string,
        "a direct (unpooled) DSN for LISTEN when dsn goes through PgBouncer"),
    Key(DATABASE, "prepared_statements", "boolean", True, flag,
        "prepare the worker pool's statements on a direct connection; off through a pooler "
        "the daemon detects at start, whatever this says"),
    Key(DATABASE, "schema", "identifier", DEFAULT_SCHEMA, schema,
        "schema holding pgtick's tables (a plain identifier)"),
    Key(DATABASE, "pool_size", f"integer 1-{MAX_POOL_SIZE}", DEFAULT_POOL_SIZE,
        integer(1, MAX_POOL_SIZE,
                "every connection counts against the server's max_connections, 100 by default"),
        "connections in the pool, shared by the worker threads and the loops"),

    Key(WORKER, "threads", f"integer 1-{MAX_THREADS}", DEFAULT_THREADS, integer(1, MAX_THREADS),
        "handlers running at once, per worker process"),
    Key(WORKER, "lease", DURATION, DEFAULT_LEASE_SECONDS, _LEASE,
        "how long a claimed run is ours without a heartbeat"),
    Key(WORKER, "heartbeat", DURATION, DEFAULT_HEARTBEAT_SECONDS, _SECONDS,
        "lease renewal interval; defaults to lease / 3, must be shorter than lease"),
    Key(WORKER, "poll_interval", DURATION, DEFAULT_POLL_INTERVAL_SECONDS, _SECONDS,
        "fallback when no NOTIFY arrives"),
    Key(WORKER, "shutdown_grace", DURATION_OR_ZERO, DEFAULT_SHUTDOWN_GRACE_SECONDS,
        _SECONDS_OR_ZERO,
        'on SIGTERM, how long running handlers may finish ("0s": cancel at once)'),
    Key(WORKER, "imports", "array of module names", (), imports,
        'modules whose @pgtick.job decorators register handlers, e.g. ["myapp.jobs"]'),
    Key(WORKER, "prefetch", f"integer 0-{MAX_PREFETCH}", DEFAULT_PREFETCH,
        integer(0, MAX_PREFETCH),
        "at most this many runs claimed beyond free threads while a backlog of short runs "
        "waits (none when idle or when handlers take long); 0: never"),
    Key(WORKER, "service", "name", DEFAULT_SERVICE, job_type_ref,
        "the service this daemon belongs to: its config sync creates, updates and pauses only "
        "this service's schedules (daemons of one service share its [schedules])"),
    Key(WORKER, "refuse_undeclared_job_types", "boolean", False, flag,
        "`pgtick enqueue` refuses (exit 2) a job type this config does not declare; the SQL "
        "and Python enqueue do not read the config"),
    Key(WORKER, "processes", f'integer 1-{MAX_PROCESSES}, or "auto"', DEFAULT_PROCESSES,
        process_count(MAX_PROCESSES),
        'worker processes, each with worker.threads threads and its own connections; "auto" = '
        "one per CPU this unit may use (its affinity, lowered to its cgroup CPU quota); above 1 "
        "a supervisor process owns the ticker, the reaper, the HTTP listeners and the signals"),
    Key(WORKER, "max_runs_per_process", "integer >= 0", DEFAULT_MAX_RUNS_PER_PROCESS,
        integer(0),
        "with processes above 1: a worker process finishing this many runs is drained and "
        "replaced (a handler that leaks); 0: never"),
    Key(WORKER, "max_memory_mib", "integer >= 0", DEFAULT_MAX_MEMORY_MIB, integer(0),
        "with processes above 1: a worker process whose resident memory passes this many MiB "
        "is drained and replaced; 0: never"),

    Key(TICKER, "interval", DURATION, DEFAULT_TICK_INTERVAL_SECONDS, _SECONDS,
        "how often schedules are materialized (plus an early wake before a due run)"),
    Key(TICKER, "lookahead", DURATION_OR_ZERO, DEFAULT_LOOKAHEAD_SECONDS,
        duration(allow_zero=True, high=MAX_LOOKAHEAD_SECONDS,
                 why="runs are created in advance this far, all in one tick"),
        'create runs this far ahead so they start on time ("0s": at the tick)'),
    Key(TICKER, "reaper_interval", DURATION, DEFAULT_REAPER_INTERVAL_SECONDS, _SECONDS,
        "how often runs with an expired lease are failed or retried"),

    Key(METRICS, "listen", LISTEN, DEFAULT_METRICS_LISTEN, listen,
        '/metrics, /healthz, /readyz; "[::1]:9464" for IPv6; "" disables the HTTP server'),
    Key(METRICS, "other_job_types", f"integer 0-{MAX_OTHER_JOB_TYPES}",
        DEFAULT_OTHER_JOB_TYPES, integer(0, MAX_OTHER_JOB_TYPES),
        "job types not in the config that get their own job_type label in the database-derived "
        'series, busiest first; the rest are summed under job_type="other"'),

    Key(WEB, "listen", LISTEN, DEFAULT_WEB_LISTEN, listen,
        "the web console; a non-loopback address is refused unless token_file or "
        "viewer_token_file is set"),
    Key(WEB, "token_file", 'file path, or "" for none', DEFAULT_WEB_TOKEN_FILE, optional_path,
        'the operators\' token: logging in with it enables the console\'s actions; "" = no '
        "operator login"),
    Key(WEB, "viewer_token_file", 'file path, or "" for none', DEFAULT_WEB_VIEWER_TOKEN_FILE,
        optional_path,
        'the viewers\' token: logging in with it shows every page, never an action; "" = no '
        "viewer login"),
    Key(WEB, "session_ttl", DURATION, DEFAULT_WEB_SESSION_TTL_SECONDS,
        duration(high=MAX_WEB_SESSION_TTL_SECONDS, why="a stolen cookie stays useful this long"),
        "lifetime of a login session cookie (the token pasted on the login page)"),
    Key(WEB, "hosts", "array of host names", DEFAULT_WEB_HOSTS, host_names,
        "Host header names the console answers besides its listen address (421 otherwise)"),
    Key(WEB, "public_reads", "boolean", DEFAULT_WEB_PUBLIC_READS, flag,
        "true: beyond loopback, pages are readable without a login session (actions still "
        "need one)"),
    Key(WEB, "horizon_threshold", DURATION, DEFAULT_WEB_HORIZON_THRESHOLD_SECONDS, _SECONDS,
        "the banner names a snapshot (or slot, or prepared transaction) holding the MVCC "
        "horizon longer than this, as `pgtick status --horizon-threshold` does"),

    Key(LOGGING, "format", " | ".join(LOG_FORMATS), DEFAULT_LOG_FORMAT, choice(LOG_FORMATS),
        "auto: console on a TTY, JSON lines otherwise"),
    Key(LOGGING, "level", " | ".join(LOG_LEVELS), DEFAULT_LOG_LEVEL, choice(LOG_LEVELS),
        "the least severe level logged"),
    Key(LOGGING, "job_output", "boolean", DEFAULT_LOG_JOB_OUTPUT, flag,
        "also log each line a job prints, with run_id, attempt, job_type, stream"),

    Key(TRACING, "enabled", "boolean", DEFAULT_TRACING_ENABLED, flag,
        "a span per attempt, a child of the enqueuer's span, exported as the OTEL_* environment "
        "says (OTLP over HTTP by default); needs pgtick[otel]; OTEL_SDK_DISABLED=true wins"),

    Key(RETENTION, "succeeded", DURATION, DEFAULT_RETAIN_SUCCEEDED_SECONDS, _SECONDS,
        "succeeded runs older than this are pruned (by the daemon and `pgtick prune`)"),
    Key(RETENTION, "dead", DURATION, DEFAULT_RETAIN_DEAD_SECONDS, _SECONDS,
        "dead runs older than this are pruned"),
    Key(RETENTION, "cancelled", DURATION, DEFAULT_RETAIN_CANCELLED_SECONDS, _SECONDS,
        "cancelled runs older than this are pruned"),
    Key(RETENTION, "skipped", DURATION, DEFAULT_RETAIN_SKIPPED_SECONDS, _SECONDS,
        "skipped runs older than this are pruned"),
    Key(RETENTION, "audit", DURATION, DEFAULT_RETAIN_AUDIT_SECONDS, _SECONDS,
        "audit log entries (pgtick audit) older than this are deleted by the daemon"),

    Key(JOB, "handler", '"module:function"', None, handler,
        "the Python handler, called as fn(ctx, payload); or command, or a @pgtick.job"),
    Key(JOB, "command", "non-empty array of strings", None, command,
        "a command run without a shell; the payload as JSON on stdin; exit 0 = success"),
    Key(JOB, "max_attempts", INT_POSITIVE, DEFAULT_MAX_ATTEMPTS, integer(1),
        "attempts before the run is dead"),
    Key(JOB, "backoff", " | ".join(BACKOFFS), DEFAULT_BACKOFF, choice(BACKOFFS),
        "how the delay before a retry grows"),
    Key(JOB, "backoff_base", DURATION_OR_ZERO, DEFAULT_BACKOFF_BASE_SECONDS, _SECONDS_OR_ZERO,
        "first retry delay (exponential: base * 2**(attempt-1))"),
    Key(JOB, "backoff_max", DURATION_OR_ZERO, DEFAULT_BACKOFF_MAX_SECONDS, _SECONDS_OR_ZERO,
        "longest retry delay"),
    Key(JOB, "jitter", "number in [0, 1)", DEFAULT_JITTER_FRACTION, fraction,
        "random spread on each delay, as a fraction of it"),
    Key(JOB, "timeout", DURATION, None, _SECONDS,
        "wall-time limit per attempt; default: none"),
    Key(JOB, "lease", DURATION, None, _LEASE,
        "default: worker.lease; at least twice worker.heartbeat"),
    Key(JOB, "output_max_bytes", 'size ("64KiB")', DEFAULT_OUTPUT_MAX_BYTES,
        byte_size(MIN_OUTPUT_MAX_BYTES, MAX_OUTPUT_MAX_BYTES),
        "what an attempt printed is kept up to this: half head, half tail"),
    Key(JOB, "priority", "integer", DEFAULT_PRIORITY, integer(-MAX_PRIORITY, MAX_PRIORITY),
        "default priority of its runs (higher first among due runs; enqueue may set another)"),
    Key(JOB, "max_running", INT_POSITIVE, None, integer(1),
        "at most this many of its runs running at once across every daemon; default: no limit"),
    Key(JOB, "concurrency_key", '"payload.FIELD"', None, payload_field,
        "the key of a run not given one at enqueue, read from its payload"),
    Key(JOB, "max_running_per_key", INT_POSITIVE, None, integer(1),
        "at most this many running at once per concurrency key (1: one at a time per key)"),
    Key(JOB, "rate", '"N/second|minute|hour"', None, rate,
        "at most N starts in any window of that length, across every daemon"),
    Key(JOB, "rate_per_key", '"N/second|minute|hour"', None, rate,
        "the same per concurrency key"),
    Key(JOB, "result_from_stdout", "boolean", False, flag,
        "commands: the last line of stdout, as JSON, is the run's result (at most 4 KiB)"),
    Key(JOB, "on_success", "job type, step table or array of them", None, chain_steps,
        "what to enqueue when a run of this type succeeds (docs/composition.md, Chains)"),
    Key(JOB, "on_dead", "job type, step table or array of them", None, chain_steps,
        "what to enqueue when a run of this type is dead"),

    Key(SCHEDULE, "job_type", "job type name", None, job_type_ref,
        "a [job_types] entry or a @pgtick.job type", required=True),
    Key(SCHEDULE, "cron", "cron expression", None, string,
        "five fields, @hourly/@daily/..., L, #, W and H (hashed on NAME)", required=True),
    Key(SCHEDULE, "timezone", "IANA time zone", DEFAULT_TIMEZONE, string,
        "the zone the cron expression is read in"),
    Key(SCHEDULE, "payload", "table (a JSON object)", {}, payload,
        "handed to the handler"),
    Key(SCHEDULE, "catchup", " | ".join(CATCHUPS), DEFAULT_CATCHUP, choice(CATCHUPS),
        "after downtime: latest (one run), all, or none"),
    Key(SCHEDULE, "catchup_limit", INT_POSITIVE, DEFAULT_CATCHUP_LIMIT, integer(1),
        'with catchup = "all": at most this many missed runs'),
    Key(SCHEDULE, "overlap", " | ".join(OVERLAPS), DEFAULT_OVERLAP, choice(OVERLAPS),
        "skip: an occurrence due while the previous run is unfinished is skipped | allow"),
    Key(SCHEDULE, "on_pause", " | ".join(ON_PAUSE), DEFAULT_ON_PAUSE, choice(ON_PAUSE),
        "while its job type is paused: hold (runs wait, queued, and start after the resume) "
        "| skip (occurrences recorded as skipped)"),
    Key(SCHEDULE, "jitter", DURATION_OR_ZERO, DEFAULT_SCHEDULE_JITTER_SECONDS, _SECONDS_OR_ZERO,
        "delay each run by a stable offset of up to this, so not all start at :00"),
    Key(SCHEDULE, "max_attempts", INT_POSITIVE, None, integer(1),
        "default: the job type's max_attempts"),
    Key(SCHEDULE, "priority", "integer", None, integer(-MAX_PRIORITY, MAX_PRIORITY),
        "the priority of its runs; default: the job type's"),
    Key(SCHEDULE, "on_success", "job type, step table or array of them", None, chain_steps,
        "what to enqueue when one of its runs succeeds; default: the job type's"),
    Key(SCHEDULE, "on_dead", "job type, step table or array of them", None, chain_steps,
        "what to enqueue when one of its runs is dead; default: the job type's"),
    Key(SCHEDULE, "after", "schedule name", None, job_type_ref,
        "each occurrence waits (queued) until this schedule's occurrence of the same period "
        "(its latest at or before) succeeded (docs/composition.md, After)"),
    Key(SCHEDULE, "after_deadline", DURATION, DEFAULT_AFTER_DEADLINE_SECONDS, _SECONDS,
        "with after: how long past its own occurrence a run waits at most"),
    Key(SCHEDULE, "after_missed", " | ".join(AFTER_MISSED), DEFAULT_AFTER_MISSED,
        choice(AFTER_MISSED),
        "with after: when the other occurrence is dead, skipped, missing or late past the "
        "deadline: skip (recorded skipped) | run (anyway)"),
)
# fmt: on

# -- What the loader reads: TOML key -> (dataclass field, checker), in file order ------------------

Spec = Mapping[str, tuple[str, Checker]]


def spec(table: str) -> Spec:
    """The keys of one table, in the order of ``KEYS`` (which messages list them in)."""
    return {k.name: (k.field, k.check) for k in KEYS if k.table == table}


SECTIONS: dict[str, Spec] = {
    table: spec(table) for table in dict.fromkeys(k.table for k in KEYS) if "." not in table
}
JOB_TYPE_KEYS: Spec = spec(JOB_TYPE_TABLE)
# The keys of [job_types.NAME] that name its handler: a @pgtick.job function is the handler, so
# the decorator takes every other key of the table (JOB_OPTION_KEYS), checked by the same code.
HANDLER_KEYS = ("handler", "command")
JOB_OPTION_KEYS: Spec = {k: v for k, v in JOB_TYPE_KEYS.items() if k not in HANDLER_KEYS}
SCHEDULE_KEYS: Spec = spec(SCHEDULE_TABLE)
REQUIRED_SCHEDULE_KEYS = tuple(k.name for k in KEYS if k.table == SCHEDULE_TABLE and k.required)
TOP_LEVEL = [*SECTIONS, "job_types", "schedules"]


class JobOptions(TypedDict, total=False):
    """``@pgtick.job``'s options as mypy sees them: the keys of ``JOB_OPTION_KEYS``, in its
    order, with the Python values the file's TOML values come as (durations as seconds or
    ``"5m"``, sizes as bytes or ``"64KiB"``, rates as ``"N/minute"``); None: not set. A test
    (tests/unit/test_job_decorator.py) checks that the two name the same keys."""

    max_attempts: int | None
    backoff: str | None
    backoff_base: float | str | None
    backoff_max: float | str | None
    jitter: float | None
    timeout: float | str | None
    lease: float | str | None
    output_max_bytes: int | str | None
    priority: int | None
    max_running: int | None
    concurrency_key: str | None
    max_running_per_key: int | None
    rate: str | None
    rate_per_key: str | None
    result_from_stdout: bool | None
    on_success: Any
    on_dead: Any
