"""TOML -> frozen dataclasses; every refusal is one ``ConfigError`` line that names the full key.

The loader knows every key of the config file up front, so a typo is an error (with a
suggestion) instead of a silently ignored setting, and the rest of the daemon receives values
that are already typed, in seconds, and checked. Nothing here touches the network or the database.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import tomllib
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, time
from typing import Any

from pgtick.errors import ConfigError, ScheduleError
from pgtick.scheduling.cron import load_zone, validate_cron

# --- Where the config and the DSN come from -------------------------------------------------------

DEFAULT_CONFIG_PATH = "/etc/pgtick/config.toml"
CONFIG_PATH_ENV = "PGTICK_CONFIG"
DSN_ENV = "PGTICK_DSN"
NO_DATABASE_MESSAGE = (
    "no database: set database.dsn, database.dsn_file or $PGTICK_DSN, or pass --dsn"
)

# --- Defaults, with their units -------------------------------------------------------------------

MINUTE_SECONDS = 60.0
HOUR_SECONDS = 3600.0
DAY_SECONDS = 86400.0
MAX_DURATION_SECONDS = 100 * 365 * DAY_SECONDS  # beyond this a duration is a typo, not a plan
MAX_INT4 = 2**31 - 1  # counters that end up in integer columns
# Job type and schedule names: the runs table refuses longer job types (runs_job_type_length).
MAX_NAME_CHARS = 200

DEFAULT_SCHEMA = "pgtick"
DEFAULT_POOL_SIZE = 10

DEFAULT_THREADS = 8
MAX_THREADS = 1024
DEFAULT_LEASE_SECONDS = 60.0
# Three renewals per lease: one lost heartbeat does not lose the run.
DEFAULT_HEARTBEAT_SECONDS = DEFAULT_LEASE_SECONDS / 3
DEFAULT_POLL_INTERVAL_SECONDS = 5.0
DEFAULT_SHUTDOWN_GRACE_SECONDS = 30.0
DEFAULT_PREFETCH = 256  # an upper bound: see Worker.prefetch_now
MAX_PREFETCH = 1024

DEFAULT_TICK_INTERVAL_SECONDS = 60.0
DEFAULT_LOOKAHEAD_SECONDS = 60.0
DEFAULT_REAPER_INTERVAL_SECONDS = 10.0

DEFAULT_METRICS_LISTEN = "127.0.0.1:9464"
DEFAULT_WEB_LISTEN = ""  # the console is off unless asked for
DEFAULT_WEB_TOKEN_FILE = ""

LOG_FORMATS = ("auto", "json", "console")
DEFAULT_LOG_FORMAT = "auto"
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"

DEFAULT_RETAIN_SUCCEEDED_SECONDS = 7 * DAY_SECONDS
DEFAULT_RETAIN_DEAD_SECONDS = 30 * DAY_SECONDS
DEFAULT_RETAIN_CANCELLED_SECONDS = 7 * DAY_SECONDS
DEFAULT_RETAIN_SKIPPED_SECONDS = 1 * DAY_SECONDS

DEFAULT_MAX_ATTEMPTS = 10
BACKOFFS = ("exponential", "linear", "fixed")
DEFAULT_BACKOFF = "exponential"
DEFAULT_BACKOFF_BASE_SECONDS = 10.0
DEFAULT_BACKOFF_MAX_SECONDS = 1 * HOUR_SECONDS
DEFAULT_JITTER_FRACTION = 0.2  # ±20 % of the delay

DEFAULT_TIMEZONE = "UTC"
CATCHUPS = ("latest", "all", "none")
DEFAULT_CATCHUP = "latest"
DEFAULT_CATCHUP_LIMIT = 100  # Kubernetes CronJob's figure
OVERLAPS = ("skip", "allow")
DEFAULT_OVERLAP = "skip"
DEFAULT_SCHEDULE_JITTER_SECONDS = 0.0

# --- The dataclasses ------------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class DatabaseConfig:
    """Where the database is; ``repr`` hides the DSN's password so a logged config leaks nothing."""

    dsn: str | None = None
    dsn_file: str | None = None
    schema: str = DEFAULT_SCHEMA
    pool_size: int = DEFAULT_POOL_SIZE

    def __repr__(self) -> str:
        dsn = None if self.dsn is None else redact_dsn(self.dsn)
        return (
            f"DatabaseConfig(dsn={dsn!r}, dsn_file={self.dsn_file!r}, "
            f"schema={self.schema!r}, pool_size={self.pool_size!r})"
        )


@dataclass(frozen=True)
class WorkerConfig:
    """The worker pool.

    ``heartbeat_seconds`` defaults to a third of the lease when only ``worker.lease`` is set;
    ``prefetch`` bounds how many runs may be claimed beyond free threads while there is a
    backlog of short runs (the worker claims fewer the longer its handlers take).
    """

    threads: int = DEFAULT_THREADS
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS
    shutdown_grace_seconds: float = DEFAULT_SHUTDOWN_GRACE_SECONDS
    imports: tuple[str, ...] = ()
    prefetch: int = DEFAULT_PREFETCH


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
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        """The TCP port to bind, 0 = any free one (only when ``enabled``)."""
        return _split_listen(self.listen)[1]


@dataclass(frozen=True)
class MetricsConfig(_Listener):
    """The metrics/health HTTP listener."""

    listen: str = DEFAULT_METRICS_LISTEN


@dataclass(frozen=True)
class WebConfig(_Listener):
    """The web console's listener; ``token_file`` enables actions."""

    listen: str = DEFAULT_WEB_LISTEN
    token_file: str = DEFAULT_WEB_TOKEN_FILE


@dataclass(frozen=True)
class LoggingConfig:
    """Log shape and threshold; ``auto`` means console on a TTY, JSON lines otherwise."""

    format: str = DEFAULT_LOG_FORMAT
    level: str = DEFAULT_LOG_LEVEL


@dataclass(frozen=True)
class RetentionConfig:
    """How long terminal runs are kept, per final state, before the daemon prunes them."""

    succeeded_seconds: float = DEFAULT_RETAIN_SUCCEEDED_SECONDS
    dead_seconds: float = DEFAULT_RETAIN_DEAD_SECONDS
    cancelled_seconds: float = DEFAULT_RETAIN_CANCELLED_SECONDS
    skipped_seconds: float = DEFAULT_RETAIN_SKIPPED_SECONDS


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
    jitter_seconds: float = DEFAULT_SCHEDULE_JITTER_SECONDS
    max_attempts: int | None = None


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
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    job_types: Mapping[str, JobTypeConfig] = field(default_factory=_empty_job_types)
    schedules: Mapping[str, ScheduleConfig] = field(default_factory=_empty_schedules)
    path: str | None = None

    def job_type(self, name: str) -> JobTypeConfig:
        """The configured job type, or the defaults for one known only from a decorator."""
        configured = self.job_types.get(name)
        return configured if configured is not None else JobTypeConfig(name=name)


# --- Durations ------------------------------------------------------------------------------------

_UNIT_SECONDS = {"d": DAY_SECONDS, "h": HOUR_SECONDS, "m": MINUTE_SECONDS, "s": 1.0, "ms": 0.001}
_UNIT_ORDER = list(_UNIT_SECONDS)  # largest first: "1h30m" yes, "30m1h" no
_DURATION_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|d|h|m|s)", re.ASCII)
_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*", re.ASCII)
_DURATION_HINT = 'a duration like "90s", "5m", "2h", "7d", "250ms" or "1h30m"'


def parse_duration(text: str | int | float, key: str) -> float:
    """Seconds from ``"90s"``, ``"1h30m"``, ``"250ms"`` or a bare number of seconds."""
    if isinstance(text, bool) or not isinstance(text, int | float | str):
        raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {_show(text)}")
    if isinstance(text, str):
        seconds = _parse_duration_text(text, key)
    else:
        seconds = float(text)
        if not math.isfinite(seconds):
            raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {_show(text)}")
    if seconds < 0:
        raise ConfigError(f"{key}: must not be negative, got {_show(text)}")
    if seconds > MAX_DURATION_SECONDS:
        raise ConfigError(f"{key}: must be at most 100 years, got {_show(text)}")
    return seconds


def _parse_duration_text(text: str, key: str) -> float:
    if _NUMBER.fullmatch(text):
        return float(text)
    if text.strip().startswith("-"):
        raise ConfigError(f"{key}: must not be negative, got {_show(text)}")
    total, pos, last_rank = 0.0, 0, -1
    for match in _DURATION_PART.finditer(text):
        rank = _UNIT_ORDER.index(match.group(2))
        if match.start() != pos or rank <= last_rank:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos, last_rank = match.end(), rank
    if last_rank < 0 or text[pos:].strip():
        raise ConfigError(f"{key}: expected {_DURATION_HINT}, got {_show(text)}")
    return total


def format_duration(seconds: float) -> str:
    """The shortest ``parse_duration`` spelling of ``seconds`` >= 0 ("1h30m"), for messages."""
    millis = round(seconds * 1000)
    if not math.isclose(millis, seconds * 1000, abs_tol=1e-6):
        return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"
    if millis == 0:
        return "0s"
    parts = []
    for unit in _UNIT_ORDER:
        size = round(_UNIT_SECONDS[unit] * 1000)
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


# --- Value checkers: each takes the full key and the raw value ------------------------------------

_Parser = Callable[[str, Any], Any]
_Spec = Mapping[str, tuple[str, _Parser]]

_NAME = re.compile(r"[A-Za-z0-9_.:-]+", re.ASCII)
_NAME_TEXT = "[A-Za-z0-9_.:-]+"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}", re.ASCII)
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?", re.ASCII)


def _show(value: object) -> str:
    """A value as the user wrote it in TOML, short enough for a one-line message."""
    if isinstance(value, str):
        shown = json.dumps(value, ensure_ascii=False)
        return shown if len(shown) <= 60 else shown[:56] + '..."'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, date | time):
        return f"a date/time ({value.isoformat()})"
    return "null" if value is None else type(value).__name__


def _string(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {_show(value)}")
    return value


def _optional_path(key: str, value: Any) -> str:
    """A file path, or "" for none."""
    if not isinstance(value, str):
        raise ConfigError(f'{key}: expected a file path or "" (none), got {_show(value)}')
    return value


def _integer(low: int, high: int = MAX_INT4) -> _Parser:
    wanted = "a positive integer" if low > 0 else "a non-negative integer"

    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"{key}: expected {wanted}, got {_show(value)}")
        if value > high:
            raise ConfigError(f"{key}: must be at most {high}, got {_show(value)}")
        return value

    return parse


def _choice(choices: tuple[str, ...]) -> _Parser:
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str) or value not in choices:
            raise ConfigError(f"{key}: must be one of {', '.join(choices)} (got {_show(value)})")
        return value

    return parse


def _duration(*, allow_zero: bool = False) -> _Parser:
    def parse(key: str, value: Any) -> float:
        seconds = parse_duration(value, key)
        if seconds == 0 and not allow_zero:
            raise ConfigError(f"{key}: must be longer than 0s, got {_show(value)}")
        return seconds

    return parse


def _fraction(key: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < 1  # also refuses nan
    ):
        raise ConfigError(f"{key}: expected a number in [0, 1), got {_show(value)}")
    return float(value)


def _name(key: str, value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ConfigError(f"{key}: name must match {_NAME_TEXT}, got {_show(value)}")
    if len(value) > MAX_NAME_CHARS:
        raise ConfigError(
            f"{key}: name must be at most {MAX_NAME_CHARS} characters, got {len(value)}"
        )
    return value


def job_type_name(key: str, value: str) -> str:
    """A job type named outside the config file (``pgtick enqueue TYPE``), checked like the
    file's names: a daemon could never declare a handler for any other name."""
    return _name(key, value)


def _job_type_ref(key: str, value: Any) -> str:
    return _name(key, _string(key, value))


def _schema(key: str, value: Any) -> str:
    schema = _string(key, value)
    if not _IDENTIFIER.fullmatch(schema):
        raise ConfigError(
            f"{key}: expected a plain identifier (letters, digits, underscore; not starting with "
            f"a digit; at most 63 characters), got {_show(schema)}"
        )
    if schema.lower().startswith("pg_"):
        raise ConfigError(f"{key}: the pg_ prefix is reserved by PostgreSQL, got {_show(schema)}")
    return schema


def schema_name(key: str, value: str) -> str:
    """A schema name given outside the config file (``--schema``), checked like the file's."""
    return _schema(key, value)


def _dotted(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _imports(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{key}: expected an array of module names, got {_show(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not _dotted(item):
            raise ConfigError(
                f'{key}[{index}]: expected a dotted module name (e.g. "myapp.jobs"), '
                f"got {_show(item)}"
            )
    return tuple(value)


def _handler(key: str, value: Any) -> str:
    module, colon, function = value.partition(":") if isinstance(value, str) else ("", "", "")
    if not colon or not _dotted(module) or not _dotted(function):
        raise ConfigError(
            f'{key}: expected "module:function" (e.g. "myapp.jobs:send_invoice_emails"), '
            f"got {_show(value)}"
        )
    return str(value)


def _command(key: str, value: Any) -> tuple[str, ...]:
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(arg, str) and "\0" not in arg for arg in value)
        or not value[0]
    ):
        raise ConfigError(
            f'{key}: expected a non-empty array of strings (e.g. ["/usr/local/bin/cleanup", '
            f'"--days", "30"]), got {_show(value)}'
        )
    return tuple(value)


def _json_value(key: str, value: Any) -> Any:
    """A payload value as it will look in jsonb; TOML-only types are refused, not mangled."""
    if isinstance(value, Mapping):
        return {name: _json_value(f"{key}.{name}", item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(f"{key}[{index}]", item) for index, item in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{key}: JSON has no {_show(value)}; use a string or a finite number")
    if isinstance(value, date | time):
        raise ConfigError(f"{key}: JSON has no dates or times, quote it: got {_show(value)}")
    if value is None or not isinstance(value, str | int | float):
        raise ConfigError(f"{key}: expected a JSON-compatible value, got {_show(value)}")
    return value


def _payload(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table like {{ days = 30 }}, got {_show(value)}")
    payload: dict[str, Any] = _json_value(key, value)
    return payload


def _split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); raises ValueError with the reason."""
    host, colon, port_text = listen.rpartition(":")
    if not colon or not host:
        raise ValueError('expected "host:port" like "127.0.0.1:9464", "0.0.0.0:9464", "[::1]:9464"')
    if not port_text.isascii() or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"port must be a number from 0 to 65535, got {port_text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
        return host[1:-1], int(port_text)
    if ":" in host:
        raise ValueError(f'IPv6 addresses go in brackets, e.g. "[{host}]:{port_text}"')
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a host name or IPv4 address")
    return host, int(port_text)


def _listen(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f'{key}: expected "host:port" or "" (disabled), got {_show(value)}')
    if value:
        try:
            _split_listen(value)
        except ValueError as exc:
            raise ConfigError(f"{key}: {exc} (got {_show(value)})") from None
    return value


# --- Which keys exist: TOML key -> (dataclass field, checker) -------------------------------------

_SECTIONS: dict[str, _Spec] = {
    "database": {
        "dsn": ("dsn", _string),
        "dsn_file": ("dsn_file", _string),
        "schema": ("schema", _schema),
        "pool_size": ("pool_size", _integer(1)),
    },
    "worker": {
        "threads": ("threads", _integer(1, MAX_THREADS)),
        "lease": ("lease_seconds", _duration()),
        "heartbeat": ("heartbeat_seconds", _duration()),
        "poll_interval": ("poll_interval_seconds", _duration()),
        "shutdown_grace": ("shutdown_grace_seconds", _duration(allow_zero=True)),
        "imports": ("imports", _imports),
        "prefetch": ("prefetch", _integer(0, MAX_PREFETCH)),
    },
    "ticker": {
        "interval": ("interval_seconds", _duration()),
        "lookahead": ("lookahead_seconds", _duration(allow_zero=True)),
        "reaper_interval": ("reaper_interval_seconds", _duration()),
    },
    "metrics": {"listen": ("listen", _listen)},
    "web": {"listen": ("listen", _listen), "token_file": ("token_file", _optional_path)},
    "logging": {
        "format": ("format", _choice(LOG_FORMATS)),
        "level": ("level", _choice(LOG_LEVELS)),
    },
    "retention": {
        "succeeded": ("succeeded_seconds", _duration()),
        "dead": ("dead_seconds", _duration()),
        "cancelled": ("cancelled_seconds", _duration()),
        "skipped": ("skipped_seconds", _duration()),
    },
}
_JOB_TYPE_KEYS: _Spec = {
    "handler": ("handler", _handler),
    "command": ("command", _command),
    "max_attempts": ("max_attempts", _integer(1)),
    "backoff": ("backoff", _choice(BACKOFFS)),
    "backoff_base": ("backoff_base_seconds", _duration(allow_zero=True)),
    "backoff_max": ("backoff_max_seconds", _duration(allow_zero=True)),
    "jitter": ("jitter", _fraction),
    "timeout": ("timeout_seconds", _duration()),
    "lease": ("lease_seconds", _duration()),
}
_SCHEDULE_KEYS: _Spec = {
    "job_type": ("job_type", _job_type_ref),
    "cron": ("cron", _string),
    "timezone": ("timezone", _string),
    "payload": ("payload", _payload),
    "catchup": ("catchup", _choice(CATCHUPS)),
    "catchup_limit": ("catchup_limit", _integer(1)),
    "overlap": ("overlap", _choice(OVERLAPS)),
    "jitter": ("jitter_seconds", _duration(allow_zero=True)),
    "max_attempts": ("max_attempts", _integer(1)),
}
_TOP_LEVEL = [*_SECTIONS, "job_types", "schedules"]


def _suggestion(key: str, known: list[str]) -> str | None:
    """The closest known key; ``lease_seconds`` also finds ``lease`` (the field vs. the key)."""
    if key.endswith("_seconds") and key.removesuffix("_seconds") in known:
        return key.removesuffix("_seconds")
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


def _unknown(prefix: str, key: str, spec: _Spec) -> ConfigError:
    full = f"{prefix}.{key}"
    # The right key in the wrong place beats a near miss in this one.
    for home, keys in (("job_types", _JOB_TYPE_KEYS), ("schedules", _SCHEDULE_KEYS)):
        if key in keys and keys is not spec:
            return ConfigError(f"{full}: unknown key ({key} belongs in [{home}.NAME])")
    homes = [name for name, keys in _SECTIONS.items() if key in keys and name != prefix]
    if homes:
        return ConfigError(f"{full}: unknown key (did you mean {homes[0]}.{key}?)")
    guess = _suggestion(key, list(spec))
    if guess is not None:
        return ConfigError(f"{full}: unknown key (did you mean {prefix}.{guess}?)")
    return ConfigError(f"{full}: unknown key (known: {', '.join(spec)})")


def _unknown_top(key: str) -> ConfigError:
    guess = _suggestion(key, _TOP_LEVEL)
    if guess is not None:
        return ConfigError(f"{key}: unknown section (did you mean {guess}?)")
    homes = [name for name, keys in _SECTIONS.items() if key in keys]
    if homes:
        return ConfigError(f"{key}: unknown key (did you mean {homes[0]}.{key}?)")
    return ConfigError(f"{key}: unknown section (known: {', '.join(_TOP_LEVEL)})")


def _table(key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table ([{key}]), got {_show(value)}")
    return value


# Where mistakes go while checking: None stops at the first (the daemon's start), a list
# collects every one (``pgtick check``) and the check goes on with the defaults in their place.
_Errors = list[str] | None


def _attempt(errors: _Errors, fn: Callable[..., Any], *args: Any, default: Any) -> Any:
    """``fn(*args)``; when collecting, a ConfigError is recorded and ``default`` returned."""
    if errors is None:
        return fn(*args)
    try:
        return fn(*args)
    except ConfigError as exc:
        errors.append(str(exc))
        return default


def _fields(
    prefix: str, table: Mapping[str, Any], spec: _Spec, errors: _Errors = None
) -> dict[str, Any]:
    """Check every key of one table, in file order, so the first mistake is the one reported
    (or, collecting, every mistake in order)."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in spec:
            _attempt(errors, _raise, _unknown(prefix, key, spec), default=None)
            continue
        attr, parse = spec[key]
        parsed = _attempt(errors, parse, f"{prefix}.{key}", value, default=_MISSING)
        if parsed is not _MISSING:
            values[attr] = parsed
    return values


_MISSING = object()


def _raise(exc: ConfigError) -> None:
    raise exc


# --- Building the sections ------------------------------------------------------------------------


def _section(name: str, data: Mapping[str, Any], errors: _Errors = None) -> dict[str, Any]:
    table = _attempt(errors, _table, name, data.get(name, {}), default={})
    return _fields(name, table, _SECTIONS[name], errors)


def _database(data: Mapping[str, Any], errors: _Errors = None) -> DatabaseConfig:
    values = _section("database", data, errors)
    if "dsn" in values and "dsn_file" in values:
        raise ConfigError("database.dsn_file: set database.dsn or database.dsn_file, not both")
    return DatabaseConfig(**values)


def _worker(data: Mapping[str, Any], errors: _Errors = None) -> WorkerConfig:
    values = _section("worker", data, errors)
    lease = values.setdefault("lease_seconds", DEFAULT_LEASE_SECONDS)
    heartbeat = values.setdefault("heartbeat_seconds", lease / 3)
    if heartbeat >= lease:
        raise ConfigError(
            f"worker.heartbeat: must be shorter than worker.lease "
            f"({format_duration(heartbeat)} is not shorter than {format_duration(lease)})"
        )
    return WorkerConfig(**values)


def is_loopback(host: str) -> bool:
    """Whether ``host`` can only be reached from this machine (``localhost``, 127.0.0.0/8,
    ``::1``); a name other than ``localhost`` may resolve anywhere, so it is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _web(data: Mapping[str, Any]) -> WebConfig:
    """Payloads and errors may hold personal data: off loopback, only behind a token."""
    web = WebConfig(**_section("web", data))
    if web.enabled and not web.token_file and not is_loopback(web.host):
        raise ConfigError(
            f"web.listen: {web.listen!r} is not a loopback address; set web.token_file "
            "to serve the console beyond this machine, or listen on 127.0.0.1"
        )
    return web


def read_token(web: WebConfig) -> str | None:
    """The console's action token from ``web.token_file`` (None: no file set, read-only)."""
    if not web.token_file:
        return None
    try:
        with open(web.token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise ConfigError(
            f"web.token_file: cannot read {web.token_file}: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"web.token_file: {web.token_file} is not valid UTF-8") from None
    if not token:
        raise ConfigError(f"web.token_file: {web.token_file} is empty")
    return token


def job_type_config(
    name: str,
    value: Any,
    worker: WorkerConfig,
    *,
    prefix: str | None = None,
    errors: _Errors = None,
) -> JobTypeConfig:
    """A job type's settings from a ``[job_types.NAME]`` table, or from ``@pgtick.job``'s
    options (the same keys and checks; ``prefix`` then names the decorator in errors)."""
    prefix = prefix or f"job_types.{name}"
    _name(prefix, name)
    values = _fields(prefix, _table(prefix, value), _JOB_TYPE_KEYS, errors)
    if "handler" in values and "command" in values:
        raise ConfigError(f"{prefix}: set handler or command, not both")
    base = values.get("backoff_base_seconds", DEFAULT_BACKOFF_BASE_SECONDS)
    if values.get("backoff_max_seconds", DEFAULT_BACKOFF_MAX_SECONDS) < base:
        raise ConfigError(f"{prefix}.backoff_max: must not be shorter than {prefix}.backoff_base")
    lease = values.get("lease_seconds")
    if lease is not None and lease <= worker.heartbeat_seconds:
        raise ConfigError(
            f"{prefix}.lease: must be longer than worker.heartbeat "
            f"({format_duration(worker.heartbeat_seconds)}) or it expires between heartbeats"
        )
    return JobTypeConfig(name=name, **values)


def _schedule(name: str, value: Any, errors: _Errors = None) -> ScheduleConfig:
    prefix = f"schedules.{name}"
    _name(prefix, name)
    table = _table(prefix, value)
    values = _fields(prefix, table, _SCHEDULE_KEYS, errors)
    problems = [
        ConfigError(f"{prefix}.{required}: missing (every schedule needs one)")
        for required in ("job_type", "cron")
        if required not in table
    ]
    if "cron" in values:
        try:
            validate_cron(values["cron"], name)
        except ScheduleError as exc:
            problems.append(ConfigError(f"{prefix}.cron: {exc}"))
    if "timezone" in values:
        try:
            load_zone(values["timezone"])
        except ScheduleError as exc:
            problems.append(ConfigError(f"{prefix}.timezone: {exc}"))
    if problems and errors is None:
        raise problems[0]
    if problems or not {"job_type", "cron"} <= values.keys():
        assert errors is not None
        errors.extend(str(problem) for problem in problems)
        raise _Skipped(prefix)
    return ScheduleConfig(name=name, **values)


class _Skipped(Exception):
    """A schedule left out of a collecting check."""


def config_from_mapping(
    data: Mapping[str, Any], *, path: str | None = None, errors: _Errors = None
) -> Config:
    """Check a parsed TOML document and turn it into a ``Config``, stopping at the first
    mistake, or, given an ``errors`` list, recording every mistake in it."""
    for key in data:
        if key not in _TOP_LEVEL:
            _attempt(errors, _raise, _unknown_top(key), default=None)
    database = _attempt(errors, _database, data, errors, default=DatabaseConfig())
    worker = _attempt(errors, _worker, data, errors, default=WorkerConfig())
    ticker = TickerConfig(**_section("ticker", data, errors))
    metrics = MetricsConfig(**_section("metrics", data, errors))
    web = _attempt(errors, _web, data, default=WebConfig())
    logging = LoggingConfig(**_section("logging", data, errors))
    retention = RetentionConfig(**_section("retention", data, errors))
    job_types = _attempt(errors, _table, "job_types", data.get("job_types", {}), default={})
    schedules = _attempt(errors, _table, "schedules", data.get("schedules", {}), default={})
    checked_types: dict[str, JobTypeConfig] = {}
    for name, value in job_types.items():
        jt = _attempt(errors, _job_type, name, value, worker, errors, default=None)
        if jt is not None:
            checked_types[name] = jt
    checked_schedules: dict[str, ScheduleConfig] = {}
    for name, value in schedules.items():
        try:
            sc = _attempt(errors, _schedule, name, value, errors, default=None)
        except _Skipped:
            continue
        if sc is not None:
            checked_schedules[name] = sc
    return Config(
        database=database,
        worker=worker,
        ticker=ticker,
        metrics=metrics,
        web=web,
        logging=logging,
        retention=retention,
        job_types=types.MappingProxyType(checked_types),
        schedules=types.MappingProxyType(checked_schedules),
        path=path,
    )


def _job_type(name: str, value: Any, worker: WorkerConfig, errors: _Errors) -> JobTypeConfig:
    return job_type_config(name, value, worker, errors=errors)


class ConfigErrors(ConfigError):
    """Every mistake found in one config file (``load_config(..., every_error=True)``); its
    text is the first, ``messages`` holds them all, each naming the file and the key."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(messages[0])
        self.messages = messages


# --- Files and the environment --------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None,
    *,
    env: Mapping[str, str] | None = None,
    every_error: bool = False,
) -> Config:
    """Read and check the config file; with no path and no file at the default place, defaults.
    ``every_error``: raise ``ConfigErrors`` with every mistake rather than the first.

    ``path`` None falls back to ``$PGTICK_CONFIG`` and then ``DEFAULT_CONFIG_PATH``; only the
    latter may be missing, so that ``pgtick migrate --dsn ...`` works without any file.
    """
    environ = os.environ if env is None else env
    if path is None and environ.get(CONFIG_PATH_ENV):
        path = environ[CONFIG_PATH_ENV]
    if path is None:
        if not os.path.exists(DEFAULT_CONFIG_PATH):
            return Config()
        path = DEFAULT_CONFIG_PATH
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read config file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not valid UTF-8 (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{name}: not valid TOML: {exc}") from None
    errors: _Errors = [] if every_error else None
    try:
        config = config_from_mapping(data, path=name, errors=errors)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if errors:
        raise ConfigErrors([f"{name}: {message}" for message in errors])
    return config


def resolve_dsn(
    db: DatabaseConfig, override: str | None = None, env: Mapping[str, str] | None = None
) -> str:
    """The DSN to connect with: ``--dsn`` > ``$PGTICK_DSN`` > ``database.dsn`` > ``dsn_file``."""
    environ = os.environ if env is None else env
    if override:
        return override
    if environ.get(DSN_ENV):
        return environ[DSN_ENV]
    if db.dsn:
        return db.dsn
    if db.dsn_file:
        try:
            with open(db.dsn_file, encoding="utf-8") as fh:
                dsn = fh.read().strip()
        except OSError as exc:
            raise ConfigError(
                f"database.dsn_file: cannot read {db.dsn_file}: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError:
            raise ConfigError(f"database.dsn_file: {db.dsn_file} is not valid UTF-8") from None
        if not dsn:
            raise ConfigError(f"database.dsn_file: {db.dsn_file} is empty")
        return dsn
    raise ConfigError(NO_DATABASE_MESSAGE)


_URL_SCHEME = re.compile(r"^(postgres(?:ql)?://)", re.IGNORECASE)
_URL_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&#]*", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)


def redact_dsn(dsn: str) -> str:
    """The DSN with its password replaced by ``***``, in URL and key=value form, for logs."""
    scheme = _URL_SCHEME.match(dsn)
    if scheme is None:
        return _KV_PASSWORD.sub(r"\1***", dsn)
    rest = dsn[scheme.end() :]
    slash = rest.find("/")
    authority_end = len(rest) if slash < 0 else slash
    at = rest.rfind("@", 0, authority_end)  # the last "@": an unescaped one in a password
    if at >= 0 and ":" in rest[:at]:
        user = rest[: rest.index(":")]
        rest = f"{user}:***{rest[at:]}"
    return scheme.group(1) + _URL_QUERY_PASSWORD.sub(r"\1***", rest)


__all__ = [
    "Config",
    "ConfigErrors",
    "DatabaseConfig",
    "JobTypeConfig",
    "LoggingConfig",
    "MetricsConfig",
    "RetentionConfig",
    "ScheduleConfig",
    "TickerConfig",
    "WebConfig",
    "WorkerConfig",
    "config_from_mapping",
    "format_duration",
    "load_config",
    "parse_duration",
    "read_token",
    "redact_dsn",
    "resolve_dsn",
]
