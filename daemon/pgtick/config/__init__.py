"""The configuration: TOML file -> frozen, typed, checked dataclasses.

- ``schema``: every key in one declarative table (table, key, type, default, doc, checker),
  and the defaults as named constants with their unit;
- ``values``: durations and the checkers of single values (their messages are pinned by tests);
- ``model``: the frozen dataclasses the daemon receives (``Config``, one per section);
- ``load``: the loader driven by the table, the rules that span keys, the file and the DSN.

Every refusal is one ``ConfigError`` line naming the full key. Pure: no network, no database.
Callers import from this package (``from pgtick.config import Config, load_config``). May
import ``pgtick.scheduling`` (to check cron expressions and time zones) and ``pgtick.errors``,
nothing else of pgtick.
"""

from __future__ import annotations

from pgtick.config import model
from pgtick.config.load import (
    CONFIG_PATH_ENV,
    DEFAULT_CONFIG_PATH,
    DSN_ENV,
    NO_DATABASE_MESSAGE,
    ConfigErrors,
    check_chain_cycles,
    check_key_field,
    config_from_mapping,
    job_type_config,
    load_config,
    read_token,
    read_viewer_token,
    resolve_dsn,
)
from pgtick.config.model import *  # noqa: F403  (the dataclasses: model.__all__)
from pgtick.config.schema import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_POLL_INTERVAL_SECONDS,
    DEFAULT_REAPER_INTERVAL_SECONDS,
    DEFAULT_SHUTDOWN_GRACE_SECONDS,
    KEYS,
    JobOptions,
    Key,
)
from pgtick.config.values import (
    format_duration,
    is_loopback,
    job_type_name,
    parse_duration,
    schema_name,
)
from pgtick.observability.redact import redact_dsn

__all__ = [
    "CONFIG_PATH_ENV",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_POLL_INTERVAL_SECONDS",
    "DEFAULT_REAPER_INTERVAL_SECONDS",
    "DEFAULT_SHUTDOWN_GRACE_SECONDS",
    "DSN_ENV",
    "KEYS",
    "NO_DATABASE_MESSAGE",
    "ConfigErrors",
    "JobOptions",
    "Key",
    "check_chain_cycles",
    "check_key_field",
    "config_from_mapping",
    "format_duration",
    "is_loopback",
    "job_type_config",
    "job_type_name",
    "load_config",
    "parse_duration",
    "read_token",
    "read_viewer_token",
    "redact_dsn",
    "resolve_dsn",
    "schema_name",
]
__all__ += model.__all__
