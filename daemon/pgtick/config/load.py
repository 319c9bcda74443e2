"""The loader: a TOML file (or a parsed mapping) -> ``Config``, driven by ``schema``'s table.

The loader knows every key of the config file up front, so a typo is an error (with a
suggestion) instead of a silently ignored setting, and the rest of the daemon receives values
that are already typed, in seconds, and checked. Every refusal is one ``ConfigError`` line
that names the full key; the rules that span keys (dsn or dsn_file, heartbeat shorter than
lease, a console off loopback needs a token, ...) live here. Nothing here touches the network
or the database.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
from collections.abc import Callable, Mapping
from typing import Any

from pgtick.config.model import (
    Config,
    DatabaseConfig,
    JobTypeConfig,
    LoggingConfig,
    MetricsConfig,
    RetentionConfig,
    ScheduleConfig,
    TickerConfig,
    TracingConfig,
    WebConfig,
    WorkerConfig,
)
from pgtick.config.schema import (
    DEFAULT_BACKOFF_BASE_SECONDS,
    DEFAULT_BACKOFF_MAX_SECONDS,
    DEFAULT_LEASE_SECONDS,
    HANDLER_KEYS,
    JOB_OPTION_KEYS,
    JOB_TYPE_KEYS,
    MIN_LEASE_HEARTBEATS,
    REQUIRED_SCHEDULE_KEYS,
    SCHEDULE_KEYS,
    SECTIONS,
    TOP_LEVEL,
    Spec,
)
from pgtick.config.values import format_duration, is_loopback, show
from pgtick.config.values import name as check_name
from pgtick.errors import ConfigError, ScheduleError
from pgtick.scheduling.cron import load_zone, validate_cron

# -- Where the config and the DSN come from -------------------------------------------------------

DEFAULT_CONFIG_PATH = "/etc/pgtick/config.toml"
CONFIG_PATH_ENV = "PGTICK_CONFIG"
DSN_ENV = "PGTICK_DSN"
NO_DATABASE_MESSAGE = (
    "no database: set database.dsn, database.dsn_file or $PGTICK_DSN, or pass --dsn"
)


def _suggestion(key: str, known: list[str]) -> str | None:
    """The closest known key; ``lease_seconds`` also finds ``lease`` (the field vs. the key)."""
    if key.endswith("_seconds") and key.removesuffix("_seconds") in known:
        return key.removesuffix("_seconds")
    close = difflib.get_close_matches(key, known, n=1)
    return close[0] if close else None


def _unknown(prefix: str, key: str, spec: Spec) -> ConfigError:
    full = f"{prefix}.{key}"
    if spec is JOB_OPTION_KEYS and key in HANDLER_KEYS:
        return ConfigError(
            f"{full}: not an option of @pgtick.job (the decorated function is the handler)"
        )
    # The right key in the wrong place beats a near miss in this one.
    for home, keys in (("job_types", JOB_TYPE_KEYS), ("schedules", SCHEDULE_KEYS)):
        if key in keys and keys is not spec:
            return ConfigError(f"{full}: unknown key ({key} belongs in [{home}.NAME])")
    homes = [name for name, keys in SECTIONS.items() if key in keys and name != prefix]
    if homes:
        return ConfigError(f"{full}: unknown key (did you mean {homes[0]}.{key}?)")
    guess = _suggestion(key, list(spec))
    if guess is not None:
        return ConfigError(f"{full}: unknown key (did you mean {prefix}.{guess}?)")
    return ConfigError(f"{full}: unknown key (known: {', '.join(spec)})")


def _unknown_top(key: str) -> ConfigError:
    guess = _suggestion(key, TOP_LEVEL)
    if guess is not None:
        return ConfigError(f"{key}: unknown section (did you mean {guess}?)")
    homes = [name for name, keys in SECTIONS.items() if key in keys]
    if homes:
        return ConfigError(f"{key}: unknown key (did you mean {homes[0]}.{key}?)")
    return ConfigError(f"{key}: unknown section (known: {', '.join(TOP_LEVEL)})")


def _table(key: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: expected a table ([{key}]), got {show(value)}")
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
    prefix: str, table: Mapping[str, Any], spec: Spec, errors: _Errors = None
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


# -- Building the sections ------------------------------------------------------------------------


def _section(name: str, data: Mapping[str, Any], errors: _Errors = None) -> dict[str, Any]:
    table = _attempt(errors, _table, name, data.get(name, {}), default={})
    return _fields(name, table, SECTIONS[name], errors)


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


def _web(data: Mapping[str, Any]) -> WebConfig:
    """Payloads and errors may hold personal data: off loopback, only behind a token."""
    web = WebConfig(**_section("web", data))
    logins = web.token_file or web.viewer_token_file
    if web.enabled and not logins and not is_loopback(web.host):
        raise ConfigError(
            f"web.listen: {web.listen!r} is not a loopback address; set web.token_file "
            "(or web.viewer_token_file) to serve the console beyond this machine, or "
            "listen on 127.0.0.1"
        )
    return web


def read_token(web: WebConfig) -> str | None:
    """The console's action token from ``web.token_file`` (None: no file set, read-only)."""
    if not web.token_file:
        return None
    return _read_secret("web.token_file", web.token_file)


def read_viewer_token(web: WebConfig) -> str | None:
    """The viewers' token from ``web.viewer_token_file`` (None: no viewer login); the
    operators' token there too is refused (every viewer could act)."""
    if not web.viewer_token_file:
        return None
    token = _read_secret("web.viewer_token_file", web.viewer_token_file)
    if token == read_token(web):
        raise ConfigError(
            "web.viewer_token_file: holds the same token as web.token_file; a viewer could "
            "act as an operator"
        )
    return token


def _read_secret(key: str, path: str) -> str:
    """The stripped text of the file a key names (a token, a DSN); an unreadable, non-UTF-8 or
    empty file is a ``ConfigError`` naming the key."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: {path} is not valid UTF-8") from None
    if not text:
        raise ConfigError(f"{key}: {path} is empty")
    return text


def job_type_config(
    name: str,
    value: Any,
    worker: WorkerConfig,
    *,
    prefix: str | None = None,
    errors: _Errors = None,
    decorator: bool = False,
) -> JobTypeConfig:
    """A job type's settings from a ``[job_types.NAME]`` table, or, ``decorator``, from
    ``@pgtick.job``'s options (the same keys but those that name the handler, the same checks;
    ``prefix`` then names the decorator in errors)."""
    prefix = prefix or f"job_types.{name}"
    check_name(prefix, name)
    keys = JOB_OPTION_KEYS if decorator else JOB_TYPE_KEYS
    values = _fields(prefix, _table(prefix, value), keys, errors)
    if "handler" in values and "command" in values:
        raise ConfigError(f"{prefix}: set handler or command, not both")
    base = values.get("backoff_base_seconds", DEFAULT_BACKOFF_BASE_SECONDS)
    if values.get("backoff_max_seconds", DEFAULT_BACKOFF_MAX_SECONDS) < base:
        raise ConfigError(f"{prefix}.backoff_max: must not be shorter than {prefix}.backoff_base")
    lease = values.get("lease_seconds")
    least = MIN_LEASE_HEARTBEATS * worker.heartbeat_seconds
    if lease is not None and lease < least:
        raise ConfigError(
            f"{prefix}.lease: must be at least twice worker.heartbeat ({format_duration(least)}),"
            f" got {format_duration(lease)}, so that one late heartbeat does not lose the run"
        )
    per_key, most = values.get("max_running_per_key"), values.get("max_running")
    if per_key is not None and most is not None and per_key > most:
        raise ConfigError(
            f"{prefix}.max_running_per_key: must not exceed {prefix}.max_running ({most}),"
            f" got {per_key}"
        )
    return JobTypeConfig(name=name, **values)


def _schedule(name: str, value: Any, errors: _Errors = None) -> ScheduleConfig:
    prefix = f"schedules.{name}"
    check_name(prefix, name)
    table = _table(prefix, value)
    values = _fields(prefix, table, SCHEDULE_KEYS, errors)
    problems = [
        ConfigError(f"{prefix}.{required}: missing (every schedule needs one)")
        for required in REQUIRED_SCHEDULE_KEYS
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
    if problems or not set(REQUIRED_SCHEDULE_KEYS) <= values.keys():
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
        if key not in TOP_LEVEL:
            _attempt(errors, _raise, _unknown_top(key), default=None)
    database = _attempt(errors, _database, data, errors, default=DatabaseConfig())
    worker = _attempt(errors, _worker, data, errors, default=WorkerConfig())
    ticker = TickerConfig(**_section("ticker", data, errors))
    metrics = MetricsConfig(**_section("metrics", data, errors))
    web = _attempt(errors, _web, data, default=WebConfig())
    logging = LoggingConfig(**_section("logging", data, errors))
    tracing = TracingConfig(**_section("tracing", data, errors))
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
    for sc in checked_schedules.values():
        _attempt(errors, check_key_field, sc, checked_types.get(sc.job_type), default=None)
    _attempt(errors, check_chain_cycles, checked_types, default=None)
    _attempt(errors, check_after, checked_schedules, default=None)
    return Config(
        database=database,
        worker=worker,
        ticker=ticker,
        metrics=metrics,
        web=web,
        logging=logging,
        tracing=tracing,
        retention=retention,
        job_types=types.MappingProxyType(checked_types),
        schedules=types.MappingProxyType(checked_schedules),
        path=path,
    )


def check_chain_cycles(job_types: Mapping[str, JobTypeConfig]) -> None:
    """Refuse job types whose chains lead back to themselves: each run would chain the
    next for ever (docs/composition.md, Chains)."""
    from pgtick.scheduling import steps

    cycle = steps.find_cycle({name: jt.follow for name, jt in job_types.items()})
    if cycle:
        raise ConfigError(
            f"job_types.{cycle[0]}.on_success/on_dead: the chain is a cycle "
            f"({' -> '.join(cycle)}); a chain must end"
        )


def check_after(schedules: Mapping[str, ScheduleConfig]) -> None:
    """``after`` names another schedule, and no schedules wait for each other in a circle
    (each would wait for the other until its deadline, every period)."""
    for name, sc in schedules.items():
        if sc.after == name:
            raise ConfigError(f"schedules.{name}.after: a schedule cannot wait for itself")
    for start in sorted(schedules):
        seen = [start]
        nxt = schedules[start].after
        while nxt is not None and nxt in schedules:
            if nxt in seen:
                cycle = " -> ".join([*seen[seen.index(nxt) :], nxt])
                raise ConfigError(f"schedules.{start}.after: schedules wait in a circle ({cycle})")
            seen.append(nxt)
            nxt = schedules[nxt].after


def check_key_field(
    schedule: ScheduleConfig, job_type: JobTypeConfig | None, where: str | None = None
) -> None:
    """A schedule's runs must carry the field their job type's concurrency key reads;
    ``where`` names the job type's settings (default: its ``[job_types.NAME]`` table)."""
    path = job_type.concurrency_key if job_type is not None else None
    if path is None:
        return
    value: Any = schedule.payload
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            raise ConfigError(
                f"schedules.{schedule.name}.payload: has no field payload.{'.'.join(path)},"
                f" which {where or f'job_types.{schedule.job_type}'}.concurrency_key reads"
            )
        value = value[part]


def _job_type(name: str, value: Any, worker: WorkerConfig, errors: _Errors) -> JobTypeConfig:
    return job_type_config(name, value, worker, errors=errors)


class ConfigErrors(ConfigError):
    """Every mistake found in one config file (``load_config(..., every_error=True)``); its
    text is the first, ``messages`` holds them all, each naming the file and the key."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__(messages[0])
        self.messages = messages


# -- Files and the environment --------------------------------------------------------------------


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
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer too long
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
        return _read_secret("database.dsn_file", db.dsn_file)
    raise ConfigError(NO_DATABASE_MESSAGE)
