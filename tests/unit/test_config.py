"""Config loading: defaults, every refusal naming its key, durations, DSNs, the example file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtick import examples
from pgtick.config import (
    Config,
    DatabaseConfig,
    JobTypeConfig,
    LoggingConfig,
    MetricsConfig,
    Rate,
    RetentionConfig,
    ScheduleConfig,
    TickerConfig,
    WorkerConfig,
    config_from_mapping,
    format_duration,
    load_config,
    parse_duration,
    redact_dsn,
    resolve_dsn,
)
from pgtick.config import load as config_load
from pgtick.config import schema as config_schema
from pgtick.config.values import cgroup_cpu_quota, cpus_available
from pgtick.errors import ConfigError, Retry

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"
DAY = 86400.0


def load_text(text: str) -> Config:
    return config_from_mapping(tomllib.loads(text))


# --- Defaults -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attribute", "expected"),
    [
        ("database.dsn", None),
        ("database.dsn_file", None),
        ("database.schema", "pgtick"),
        ("database.pool_size", 10),
        ("worker.threads", 8),
        ("worker.lease_seconds", 60.0),
        ("worker.heartbeat_seconds", 20.0),
        ("worker.poll_interval_seconds", 5.0),
        ("worker.shutdown_grace_seconds", 30.0),
        ("worker.imports", ()),
        ("worker.prefetch", 256),
        ("ticker.interval_seconds", 60.0),
        ("ticker.lookahead_seconds", 60.0),
        ("ticker.reaper_interval_seconds", 10.0),
        ("metrics.listen", "127.0.0.1:9464"),
        ("logging.format", "auto"),
        ("logging.level", "info"),
        ("retention.succeeded_seconds", 7 * DAY),
        ("retention.dead_seconds", 30 * DAY),
        ("retention.cancelled_seconds", 7 * DAY),
        ("retention.skipped_seconds", 1 * DAY),
        ("retention.audit_seconds", 90 * DAY),
        ("job_types", {}),
        ("schedules", {}),
        ("path", None),
    ],
)
def test_every_default(attribute: str, expected: object) -> None:
    for cfg in (config_from_mapping({}), Config(), load_text("")):
        value: Any = cfg
        for part in attribute.split("."):
            value = getattr(value, part)
        assert value == expected


def test_job_type_defaults() -> None:
    assert load_text("[job_types.t]").job_types["t"] == JobTypeConfig(
        name="t",
        handler=None,
        command=None,
        max_attempts=10,
        backoff="exponential",
        backoff_base_seconds=10.0,
        backoff_max_seconds=3600.0,
        jitter=0.2,
        timeout_seconds=None,
        lease_seconds=None,
    )


def test_schedule_defaults() -> None:
    cfg = load_text('[schedules.s]\njob_type = "t"\ncron = "* * * * *"')
    assert cfg.schedules["s"] == ScheduleConfig(
        name="s",
        job_type="t",
        cron="* * * * *",
        timezone="UTC",
        payload={},
        catchup="latest",
        catchup_limit=100,
        overlap="skip",
        jitter_seconds=0.0,
        max_attempts=None,
    )


FULL = """
[database]
dsn_file = "/run/credentials/pgtick.service/dsn"
schema = "jobs_2"
pool_size = 3
listen_dsn = "postgresql://direct.internal/app"
prepared_statements = false

[worker]
threads = 32
processes = 3
max_runs_per_process = 1000
max_memory_mib = 512
lease = "2m"
heartbeat = "15s"
poll_interval = "1s"
shutdown_grace = "0s"
imports = ["myapp.jobs", "other"]
prefetch = 16
refuse_undeclared_job_types = true
service = "billing"

[ticker]
interval = "30s"
lookahead = 0
reaper_interval = "5s"

[metrics]
listen = "[::1]:0"
other_job_types = 5

[logging]
format = "json"
level = "debug"
job_output = false

[retention]
succeeded = "1d"
dead = "90d"
cancelled = "2d"
skipped = "6h"
audit = "30d"

[job_types.send_invoice_emails]
handler = "myapp.jobs:send_invoice_emails"
max_attempts = 3
backoff = "linear"
backoff_base = "1s"
backoff_max = "1m"
jitter = 0
timeout = "5m"
lease = "90s"
output_max_bytes = "1MiB"
priority = -5
max_running = 4
concurrency_key = "payload.customer.id"
max_running_per_key = 2
rate = "100/minute"
rate_per_key = "3/second"
result_from_stdout = true
on_success = { job_type = "cleanup_sessions", payload = { after = "invoice" } }
on_dead = ["cleanup_sessions"]

[job_types.cleanup_sessions]
command = ["/usr/local/bin/cleanup-sessions", "--older-than", "30d"]

[schedules.nightly_cleanup]
job_type = "cleanup_sessions"
cron = "0 3 * * *"
timezone = "Europe/Amsterdam"
payload = { days = 30, tags = ["a", "b"], nested = { x = 1.5 } }
catchup = "all"
catchup_limit = 5
overlap = "allow"
on_pause = "skip"
jitter = "30s"
max_attempts = 2
priority = 7
on_success = "send_invoice_emails"
on_dead = { job_type = "send_invoice_emails", on_success = "cleanup_sessions" }
after = "billing"
after_deadline = "2h"
after_missed = "run"
"""


def test_every_key_loads_into_its_field() -> None:
    cfg = load_text(FULL)
    assert cfg.database == DatabaseConfig(
        dsn_file="/run/credentials/pgtick.service/dsn",
        schema="jobs_2",
        pool_size=3,
        listen_dsn="postgresql://direct.internal/app",
        prepared_statements=False,
    )
    assert cfg.worker == WorkerConfig(
        threads=32,
        lease_seconds=120.0,
        heartbeat_seconds=15.0,
        poll_interval_seconds=1.0,
        shutdown_grace_seconds=0.0,
        imports=("myapp.jobs", "other"),
        prefetch=16,
        refuse_undeclared_job_types=True,
        service="billing",
        processes=3,
        max_runs_per_process=1000,
        max_memory_mib=512,
    )
    assert cfg.ticker == TickerConfig(
        interval_seconds=30.0, lookahead_seconds=0.0, reaper_interval_seconds=5.0
    )
    assert cfg.metrics == MetricsConfig(listen="[::1]:0", other_job_types=5)
    assert cfg.logging == LoggingConfig(format="json", level="debug", job_output=False)
    assert cfg.retention == RetentionConfig(
        succeeded_seconds=DAY,
        dead_seconds=90 * DAY,
        cancelled_seconds=2 * DAY,
        skipped_seconds=6 * 3600,
        audit_seconds=30 * DAY,
    )
    assert cfg.job_types["send_invoice_emails"] == JobTypeConfig(
        name="send_invoice_emails",
        handler="myapp.jobs:send_invoice_emails",
        max_attempts=3,
        backoff="linear",
        backoff_base_seconds=1.0,
        backoff_max_seconds=60.0,
        jitter=0.0,
        timeout_seconds=300.0,
        lease_seconds=90.0,
        output_max_bytes=1024 * 1024,
        priority=-5,
        max_running=4,
        concurrency_key=("customer", "id"),
        max_running_per_key=2,
        rate=Rate(100, 60.0),
        rate_per_key=Rate(3, 1.0),
        result_from_stdout=True,
        on_success=[{"job_type": "cleanup_sessions", "payload": {"after": "invoice"}}],
        on_dead=[{"job_type": "cleanup_sessions"}],
    )
    assert cfg.job_types["cleanup_sessions"].command == (
        "/usr/local/bin/cleanup-sessions",
        "--older-than",
        "30d",
    )
    assert cfg.schedules["nightly_cleanup"] == ScheduleConfig(
        name="nightly_cleanup",
        job_type="cleanup_sessions",
        cron="0 3 * * *",
        timezone="Europe/Amsterdam",
        payload={"days": 30, "tags": ["a", "b"], "nested": {"x": 1.5}},
        catchup="all",
        catchup_limit=5,
        overlap="allow",
        on_pause="skip",
        jitter_seconds=30.0,
        max_attempts=2,
        priority=7,
        on_success=[{"job_type": "send_invoice_emails"}],
        on_dead=[
            {"job_type": "send_invoice_emails", "on_success": [{"job_type": "cleanup_sessions"}]}
        ],
        after="billing",
        after_deadline_seconds=7200.0,
        after_missed="run",
    )


def test_every_field_is_reachable_from_a_key() -> None:
    """FULL sets every key to a non-default value, so no field is left without a key."""
    cfg = load_text(FULL)
    defaults: dict[str, Any] = {
        "database": DatabaseConfig(),
        "worker": WorkerConfig(),
        "ticker": TickerConfig(),
        "metrics": MetricsConfig(),
        "logging": LoggingConfig(),
        "retention": RetentionConfig(),
        "job_type": JobTypeConfig(name="x"),
        "schedule": ScheduleConfig(name="x", job_type="x", cron="x"),
    }
    loaded = {
        **{name: getattr(cfg, name) for name in list(defaults)[:6]},
        "job_type": cfg.job_types["send_invoice_emails"],
        "schedule": cfg.schedules["nightly_cleanup"],
    }
    for section, default in defaults.items():
        for f in dataclasses.fields(default):
            if (section, f.name) in {("database", "dsn"), ("job_type", "command")}:
                continue  # exclusive with dsn_file / handler: covered separately
            assert getattr(loaded[section], f.name) != getattr(default, f.name), (section, f.name)
    assert load_text('[database]\ndsn = "postgresql:///x"').database.dsn == "postgresql:///x"


def test_config_is_frozen() -> None:
    cfg = load_text(FULL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.worker.threads = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.job_types["x"] = JobTypeConfig(name="x")  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.schedules["x"] = cfg.schedules["nightly_cleanup"]  # type: ignore[index]


def test_payload_is_ready_for_json() -> None:
    payload = load_text(FULL).schedules["nightly_cleanup"].payload
    assert json.loads(json.dumps(payload)) == {"days": 30, "tags": ["a", "b"], "nested": {"x": 1.5}}


def test_heartbeat_defaults_to_a_third_of_the_lease() -> None:
    assert load_text('[worker]\nlease = "30s"').worker.heartbeat_seconds == 10.0
    assert load_text('[worker]\nlease = "30s"\nheartbeat = "25s"').worker.heartbeat_seconds == 25


def test_job_type_lookup_falls_back_to_defaults() -> None:
    cfg = load_text(FULL)
    assert cfg.job_type("send_invoice_emails").max_attempts == 3
    assert cfg.job_type("registered_by_decorator") == JobTypeConfig(name="registered_by_decorator")


def test_decorator_only_job_type_and_unknown_schedule_job_type_are_legal() -> None:
    cfg = load_text(
        "[job_types.by_decorator]\nmax_attempts = 2\n"
        '[schedules.s]\njob_type = "not_in_job_types"\ncron = "@hourly"'
    )
    assert cfg.job_types["by_decorator"].handler is None
    assert cfg.job_types["by_decorator"].command is None
    assert cfg.schedules["s"].job_type == "not_in_job_types"


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:9464", "127.0.0.1", 9464),
        ("0.0.0.0:0", "0.0.0.0", 0),
        ("localhost:65535", "localhost", 65535),
        ("metrics.internal.example:80", "metrics.internal.example", 80),
        ("[::1]:9464", "::1", 9464),
        ("[::]:9464", "::", 9464),
    ],
)
def test_metrics_listen(listen: str, host: str, port: int) -> None:
    metrics = load_text(f'[metrics]\nlisten = "{listen}"').metrics
    assert (metrics.enabled, metrics.host, metrics.port) == (True, host, port)


def test_metrics_can_be_disabled() -> None:
    assert load_text('[metrics]\nlisten = ""').metrics.enabled is False


# --- Every refusal names its key ------------------------------------------------------------------

ERRORS = [
    # unknown sections and keys, with suggestions
    ("[worker]\nthread = 8", "worker.thread: unknown key (did you mean worker.threads?)"),
    (
        "[worker]\nlease_seconds = 5",
        "worker.lease_seconds: unknown key (did you mean worker.lease?)",
    ),
    ("[worker]\ninterval = 5", "worker.interval: unknown key (did you mean ticker.interval?)"),
    ("[worker]\nzzz = 5", "worker.zzz: unknown key (known: threads, lease, heartbeat, "),
    ("[workers]\nthreads = 8", "workers: unknown section (did you mean worker?)"),
    ("threads = 8", "threads: unknown key (did you mean worker.threads?)"),
    ("[zzz]", "zzz: unknown section (known: database, "),
    (
        "[job_types.t]\nhandlr = 'a:b'",
        "job_types.t.handlr: unknown key (did you mean job_types.t.handler?)",
    ),
    (
        "[schedules.s]\ncorn = '* * * * *'",
        "schedules.s.corn: unknown key (did you mean schedules.s.cron?)",
    ),
    (
        "[worker]\ntimeout = '5m'",
        "worker.timeout: unknown key (timeout belongs in [job_types.NAME])",
    ),
    (
        "[schedules.s]\nhandler = 'a:b'",
        "schedules.s.handler: unknown key (handler belongs in [job_types.NAME])",
    ),
    (
        "[job_types.t]\ncron = '@daily'",
        "job_types.t.cron: unknown key (cron belongs in [schedules.NAME])",
    ),
    # sections of the wrong shape
    ("worker = 5", "worker: expected a table ([worker]), got 5"),
    ("job_types = 5", "job_types: expected a table ([job_types]), got 5"),
    ("[job_types]\nt = 5", "job_types.t: expected a table ([job_types.t]), got 5"),
    # database
    ("[database]\ndsn = 5", "database.dsn: expected a non-empty string, got 5"),
    ("[database]\ndsn = ''", 'database.dsn: expected a non-empty string, got ""'),
    (
        "[database]\ndsn = 'x'\ndsn_file = 'y'",
        "database.dsn_file: set database.dsn or database.dsn_file, not both",
    ),
    ("[database]\nschema = '1abc'", "database.schema: expected a plain identifier"),
    ("[database]\nschema = 'my-schema'", "database.schema: expected a plain identifier"),
    ("[database]\nschema = 'pgtick; drop'", "database.schema: expected a plain identifier"),
    (f"[database]\nschema = '{'a' * 64}'", "database.schema: expected a plain identifier"),
    (
        "[database]\nschema = 'pg_tick'",
        'database.schema: the pg_ prefix is reserved by PostgreSQL, got "pg_tick"',
    ),
    ("[database]\npool_size = 0", "database.pool_size: expected a positive integer, got 0"),
    # worker
    ("[worker]\nthreads = 'eight'", 'worker.threads: expected a positive integer, got "eight"'),
    ("[worker]\nthreads = 0", "worker.threads: expected a positive integer, got 0"),
    ("[worker]\nthreads = 8.0", "worker.threads: expected a positive integer, got 8.0"),
    ("[worker]\nthreads = true", "worker.threads: expected a positive integer, got true"),
    ("[worker]\nthreads = 1025", "worker.threads: must be at most 1024, got 1025"),
    ("[worker]\nprocesses = 0", 'worker.processes: expected an integer 1-256 or "auto", got 0'),
    (
        "[worker]\nprocesses = 'all'",
        'worker.processes: expected an integer 1-256 or "auto", got "all"',
    ),
    ("[worker]\nprocesses = 2.0", 'worker.processes: expected an integer 1-256 or "auto", got 2.0'),
    (
        "[worker]\nmax_runs_per_process = -1",
        "worker.max_runs_per_process: expected a non-negative integer, got -1",
    ),
    ("[worker]\nlease = '0s'", 'worker.lease: must be longer than 0s, got "0s"'),
    (
        "[worker]\nlease = '60'\nheartbeat = '60s'",
        "worker.heartbeat: must be shorter than worker.lease (1m is not shorter than 1m)",
    ),
    (
        "[worker]\nlease = '10s'\nheartbeat = '20s'",
        "worker.heartbeat: must be shorter than worker.lease (20s is not shorter than 10s)",
    ),
    ("[worker]\npoll_interval = 0", "worker.poll_interval: must be longer than 0s, got 0"),
    ("[worker]\nshutdown_grace = '-1s'", 'worker.shutdown_grace: must not be negative, got "-1s"'),
    (
        "[worker]\nimports = 'myapp.jobs'",
        'worker.imports: expected an array of module names, got "myapp.jobs"',
    ),
    (
        "[worker]\nimports = ['ok', 'my-app']",
        'worker.imports[1]: expected a dotted module name (e.g. "myapp.jobs"), got "my-app"',
    ),
    ("[worker]\nprefetch = -1", "worker.prefetch: expected a non-negative integer, got -1"),
    ("[worker]\nprefetch = 5000", "worker.prefetch: must be at most 1024, got 5000"),
    # ticker
    ("[ticker]\ninterval = '0s'", 'ticker.interval: must be longer than 0s, got "0s"'),
    (
        "[ticker]\nlookahead = 'soon'",
        'ticker.lookahead: expected a duration like "90s", "5m", "2h", "7d", "250ms" or "1h30m", '
        'got "soon"',
    ),
    ("[ticker]\nreaper_interval = 0", "ticker.reaper_interval: must be longer than 0s, got 0"),
    # metrics
    (
        "[metrics]\nlisten = 9464",
        'metrics.listen: expected "host:port" or "" (disabled), got 9464',
    ),
    ("[metrics]\nlisten = '9464'", 'metrics.listen: expected "host:port"'),
    ("[metrics]\nlisten = ':9464'", 'metrics.listen: expected "host:port"'),
    (
        "[metrics]\nlisten = 'localhost:http'",
        "metrics.listen: port must be a number from 0 to 65535, got 'http'",
    ),
    (
        "[metrics]\nlisten = 'localhost:65536'",
        "metrics.listen: port must be a number from 0 to 65535, got '65536'",
    ),
    (
        "[metrics]\nlisten = '::1:9464'",
        'metrics.listen: IPv6 addresses go in brackets, e.g. "[::1]:9464"',
    ),
    ("[metrics]\nlisten = '[nope]:9464'", "metrics.listen: [nope] is not an IPv6 address"),
    (
        "[metrics]\nlisten = 'bad host:9464'",
        "metrics.listen: 'bad host' is not a host name or IPv4 address",
    ),
    # logging
    (
        "[logging]\nformat = 'text'",
        'logging.format: must be one of auto, json, console (got "text")',
    ),
    (
        "[logging]\nlevel = 'INFO'",
        'logging.level: must be one of debug, info, warning, error (got "INFO")',
    ),
    ("[logging]\nlevel = 3", "logging.level: must be one of debug, info, warning, error (got 3)"),
    ("[logging]\njob_output = 1", "logging.job_output: expected true or false, got 1"),
    (
        "[job_types.x]\nhandler = 'a:b'\noutput_max_bytes = '64 parsecs'",
        'job_types.x.output_max_bytes: expected a size such as "64KiB" (B, kB, KiB, MB, MiB), '
        'got "64 parsecs"',
    ),
    (
        "[job_types.x]\nhandler = 'a:b'\noutput_max_bytes = 10",
        "job_types.x.output_max_bytes: must be between 1024 and 16777216 bytes, got 10",
    ),
    # retention
    ("[retention]\nsucceeded = '0d'", 'retention.succeeded: must be longer than 0s, got "0d"'),
    ("[retention]\ndead = '30 days'", "retention.dead: expected a duration like"),
    ("[retention]\ncancelled = []", "retention.cancelled: expected a duration like"),
    ("[retention]\nskipped = 1e300", "retention.skipped: must be at most 100 years, got 1e+300"),
    # job types
    (
        "[job_types.'send invoices']",
        'job_types.send invoices: name must match [A-Za-z0-9_.:-]+, got "send invoices"',
    ),
    (
        "[job_types.t]\nhandler = 'myapp.jobs.send'",
        'job_types.t.handler: expected "module:function" (e.g. "myapp.jobs:send_invoice_emails"), '
        'got "myapp.jobs.send"',
    ),
    ("[job_types.t]\nhandler = 'my-app:send'", 'job_types.t.handler: expected "module:function"'),
    ("[job_types.t]\nhandler = 'myapp:'", 'job_types.t.handler: expected "module:function"'),
    ("[job_types.t]\nhandler = 5", 'job_types.t.handler: expected "module:function"'),
    (
        "[job_types.t]\ncommand = '/bin/true'",
        "job_types.t.command: expected a non-empty array of strings",
    ),
    ("[job_types.t]\ncommand = []", "job_types.t.command: expected a non-empty array of strings"),
    (
        "[job_types.t]\ncommand = ['/bin/x', 5]",
        "job_types.t.command: expected a non-empty array of strings",
    ),
    ("[job_types.t]\ncommand = ['']", "job_types.t.command: expected a non-empty array of strings"),
    (
        "[job_types.t]\nhandler = 'a:b'\ncommand = ['/bin/true']",
        "job_types.t: set handler or command, not both",
    ),
    (
        "[job_types.t]\nmax_attempts = 0",
        "job_types.t.max_attempts: expected a positive integer, got 0",
    ),
    (
        "[job_types.t]\nmax_attempts = 3000000000",
        "job_types.t.max_attempts: must be at most 2147483647, got 3000000000",
    ),
    (
        "[job_types.send_invoice_emails]\nbackoff = 'expo'",
        "job_types.send_invoice_emails.backoff: "
        'must be one of exponential, linear, fixed (got "expo")',
    ),
    ("[job_types.t]\nbackoff_base = 'ten'", "job_types.t.backoff_base: expected a duration like"),
    (
        "[job_types.t]\nbackoff_base = '2h'",
        "job_types.t.backoff_max: must not be shorter than job_types.t.backoff_base",
    ),
    ("[job_types.t]\njitter = 1", "job_types.t.jitter: expected a number in [0, 1), got 1"),
    ("[job_types.t]\njitter = -0.1", "job_types.t.jitter: expected a number in [0, 1), got -0.1"),
    ("[job_types.t]\njitter = nan", "job_types.t.jitter: expected a number in [0, 1), got nan"),
    ("[job_types.t]\njitter = '20%'", 'job_types.t.jitter: expected a number in [0, 1), got "20%"'),
    ("[job_types.t]\ntimeout = '0s'", 'job_types.t.timeout: must be longer than 0s, got "0s"'),
    (
        "[job_types.t]\nlease = '20s'",
        "job_types.t.lease: must be at least twice worker.heartbeat (40s), got 20s, "
        "so that one late heartbeat does not lose the run",
    ),
    # schedules
    (
        "[schedules.'a b']\njob_type = 't'\ncron = '@daily'",
        'schedules.a b: name must match [A-Za-z0-9_.:-]+, got "a b"',
    ),
    ("[schedules.s]\ncron = '@daily'", "schedules.s.job_type: missing (every schedule needs one)"),
    ("[schedules.s]\njob_type = 't'", "schedules.s.cron: missing (every schedule needs one)"),
    (
        "[schedules.s]\njob_type = 't t'\ncron = '@daily'",
        'schedules.s.job_type: name must match [A-Za-z0-9_.:-]+, got "t t"',
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = 5",
        "schedules.s.cron: expected a non-empty string, got 5",
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\ntimezone = 1",
        "schedules.s.timezone: expected a non-empty string, got 1",
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\npayload = '{}'",
        'schedules.s.payload: expected a table like { days = 30 }, got "{}"',
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\npayload = { when = 2026-01-01 }",
        "schedules.s.payload.when: JSON has no dates or times, quote it: "
        "got a date/time (2026-01-01)",
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\npayload = { a = [1, inf] }",
        "schedules.s.payload.a[1]: JSON has no inf; use a string or a finite number",
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\ncatchup = 'some'",
        'schedules.s.catchup: must be one of latest, all, none (got "some")',
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\ncatchup_limit = 0",
        "schedules.s.catchup_limit: expected a positive integer, got 0",
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\noverlap = 'queue'",
        'schedules.s.overlap: must be one of skip, allow (got "queue")',
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\njitter = '-5s'",
        'schedules.s.jitter: must not be negative, got "-5s"',
    ),
    (
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\nmax_attempts = 0",
        "schedules.s.max_attempts: expected a positive integer, got 0",
    ),
    # Flow control (docs/flow-control.md).
    (
        "[job_types.t]\nmax_running = 0",
        "job_types.t.max_running: expected a positive integer, got 0",
    ),
    (
        "[job_types.t]\nmax_running = -2",
        "job_types.t.max_running: expected a positive integer, got -2",
    ),
    (
        "[job_types.t]\nmax_running_per_key = 0",
        "job_types.t.max_running_per_key: expected a positive integer, got 0",
    ),
    (
        "[job_types.t]\nmax_running = 2\nmax_running_per_key = 3",
        "job_types.t.max_running_per_key: must not exceed job_types.t.max_running (2), got 3",
    ),
    (
        "[job_types.t]\nrate = '100/day'",
        "job_types.t.rate: unknown unit 'day' (second, minute or hour)",
    ),
    (
        "[job_types.t]\nrate = '0/second'",
        'job_types.t.rate: the number of starts must be at least 1, got "0/second"',
    ),
    (
        "[job_types.t]\nrate = 100",
        'job_types.t.rate: expected "N/second", "N/minute" or "N/hour", got 100',
    ),
    (
        "[job_types.t]\nrate_per_key = 'fast'",
        'job_types.t.rate_per_key: expected "N/second", "N/minute" or "N/hour", got "fast"',
    ),
    (
        "[job_types.t]\nconcurrency_key = 'customer_id'",
        'job_types.t.concurrency_key: expected "payload.FIELD" (a field of the run\'s payload),'
        ' got "customer_id"',
    ),
    (
        "[job_types.t]\nconcurrency_key = 'payload.'",
        'job_types.t.concurrency_key: expected "payload.FIELD"',
    ),
    (
        "[job_types.t]\npriority = 1.5",
        "job_types.t.priority: expected an integer, got 1.5",
    ),
    (
        "[job_types.t]\npriority = -2000000",
        "job_types.t.priority: must be at least -1000000, got -2000000",
    ),
    (
        "[job_types.t]\nconcurrency_key = 'payload.customer.id'\n"
        "[schedules.s]\njob_type = 't'\ncron = '@daily'\npayload = { customer = { name = 'x' } }",
        "schedules.s.payload: has no field payload.customer.id, which"
        " job_types.t.concurrency_key reads",
    ),
]


@pytest.mark.parametrize(("text", "message"), ERRORS, ids=[e[1][:60] for e in ERRORS])
def test_refusals_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


# Whatever pgtick.schedule says about an expression or a zone, the key is put in front of it.
CRON_AND_ZONE_ERRORS = [
    ("0 0 * * * *", "UTC", "schedules.nightly.cron: "),  # six fields: seconds in croniter
    ("0 0 * * 1 2026", "UTC", "schedules.nightly.cron: "),
    ("@reboot", "UTC", "schedules.nightly.cron: "),
    ("R 3 * * *", "UTC", "schedules.nightly.cron: "),
    ("0 0 31 2 *", "UTC", "schedules.nightly.cron: "),  # never happens
    ("61 * * * *", "UTC", "schedules.nightly.cron: "),
    ("every day", "UTC", "schedules.nightly.cron: "),
    ("0 3 * * *", "Europe/Amsterdan", "schedules.nightly.timezone: "),
    ("0 3 * * *", "Mars/Olympus_Mons", "schedules.nightly.timezone: "),
    ("0 3 * * *", "../../etc/passwd", "schedules.nightly.timezone: "),
]


@pytest.mark.parametrize(("cron", "zone", "prefix"), CRON_AND_ZONE_ERRORS)
def test_bad_cron_and_zone_name_the_key(cron: str, zone: str, prefix: str) -> None:
    text = f'[schedules.nightly]\njob_type = "t"\ncron = "{cron}"\ntimezone = "{zone}"'
    with pytest.raises(ConfigError) as info:
        load_text(text)
    message = str(info.value)
    assert message.startswith(prefix)
    assert len(message) > len(prefix)
    assert "\n" not in message


@pytest.mark.parametrize(
    ("cron", "zone"),
    [
        ("* * * * *", "UTC"),
        ("30 2 * * *", "Europe/Amsterdam"),
        ("@hourly", "America/New_York"),
        ("H 3 * * *", "UTC"),
        ("0 0 L * *", "Asia/Tokyo"),
        ("0 9 * * 1#1", "UTC"),
    ],
)
def test_good_cron_and_zone(cron: str, zone: str) -> None:
    text = f'[schedules.s]\njob_type = "t"\ncron = "{cron}"\ntimezone = "{zone}"'
    assert load_text(text).schedules["s"].timezone == zone


# --- Durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("7d", 7 * DAY),
        ("250ms", 0.25),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1d2h3m4s5ms", DAY + 2 * 3600 + 3 * 60 + 4 + 0.005),
        ("1.5h", 5400.0),
        ("0s", 0.0),
        (" 10s ", 10.0),
        ("90", 90.0),
        ("2.5", 2.5),
        (90, 90.0),
        (0.5, 0.5),
        (0, 0.0),
    ],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text, "k") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "k: expected a duration like"),
        ("s", "k: expected a duration like"),
        ("5", None),
        ("5 minutes", "k: expected a duration like"),
        ("5M", "k: expected a duration like"),
        ("30m1h", "k: expected a duration like"),
        ("1h1h", "k: expected a duration like"),
        ("1h-30m", "k: expected a duration like"),
        ("1e3s", "k: expected a duration like"),
        ("-5s", 'k: must not be negative, got "-5s"'),
        ("-5", 'k: must not be negative, got "-5"'),
        (-1, "k: must not be negative, got -1"),
        (float("inf"), "k: expected a duration like"),
        (float("nan"), "k: expected a duration like"),
        (True, "k: expected a duration like"),
        ("99999999999d", "k: must be at most 100 years"),
    ],
)
def test_parse_duration_refuses(text: Any, message: str | None) -> None:
    if message is None:
        assert parse_duration(text, "k") == 5.0
        return
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        parse_duration(text, "k")


@given(
    days=st.integers(0, 400),
    hours=st.integers(0, 23),
    minutes=st.integers(0, 59),
    seconds=st.integers(0, 59),
    sep=st.sampled_from(["", " "]),
)
def test_duration_components_round_trip(
    days: int, hours: int, minutes: int, seconds: int, sep: str
) -> None:
    parts = [f"{n}{unit}" for n, unit in zip((days, hours, minutes, seconds), "dhms", strict=True)]
    text = sep.join(p for p in parts if not p.startswith("0")) or "0s"
    expected = days * DAY + hours * 3600 + minutes * 60 + seconds
    assert parse_duration(text, "k") == expected
    assert parse_duration(format_duration(expected), "k") == expected


@given(millis=st.integers(0, 10**12))
def test_format_duration_round_trip(millis: int) -> None:
    assert parse_duration(format_duration(millis / 1000), "k") == pytest.approx(millis / 1000)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (0.25, "250ms"), (60, "1m"), (5400, "1h30m"), (DAY + 1, "1d1s"), (1e-4, "0.0001s")],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# --- DSN ------------------------------------------------------------------------------------------


def test_dsn_precedence(tmp_path: Path) -> None:
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text("  postgresql://from-file/db\n")
    from_file = DatabaseConfig(dsn_file=str(dsn_file))
    both = DatabaseConfig(dsn="postgresql://from-config/db", dsn_file=str(dsn_file))
    env = {"PGTICK_DSN": "postgresql://from-env/db"}

    assert resolve_dsn(both, "postgresql://flag/db", env) == "postgresql://flag/db"
    assert resolve_dsn(both, None, env) == "postgresql://from-env/db"
    assert resolve_dsn(both, None, {}) == "postgresql://from-config/db"
    assert resolve_dsn(from_file, None, {}) == "postgresql://from-file/db"
    assert resolve_dsn(from_file, "", {"PGTICK_DSN": ""}) == "postgresql://from-file/db"


def test_dsn_from_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTICK_DSN", "postgresql://from-env/db")
    assert resolve_dsn(DatabaseConfig()) == "postgresql://from-env/db"


def test_no_dsn_anywhere() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_dsn(DatabaseConfig(), None, {})
    assert str(info.value) == (
        "no database: set database.dsn, database.dsn_file or $PGTICK_DSN, or pass --dsn"
    )


def test_dsn_file_problems(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(
        ConfigError, match=rf"^database\.dsn_file: cannot read {re.escape(str(missing))}"
    ):
        resolve_dsn(DatabaseConfig(dsn_file=str(missing)), None, {})
    empty = tmp_path / "empty"
    empty.write_text(" \n")
    with pytest.raises(ConfigError, match=r"^database\.dsn_file: .* is empty$"):
        resolve_dsn(DatabaseConfig(dsn_file=str(empty)), None, {})


@pytest.mark.parametrize(
    ("dsn", "redacted"),
    [
        ("postgresql://u:secret@h/db", "postgresql://u:***@h/db"),
        (
            "postgres://u:secret@h:5432/db?sslmode=require",
            "postgres://u:***@h:5432/db?sslmode=require",
        ),
        ("postgresql://u:p@ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://:secret@h1,h2/db", "postgresql://:***@h1,h2/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("postgresql://h:5432/db", "postgresql://h:5432/db"),
        ("postgresql:///db?host=/run/pg", "postgresql:///db?host=/run/pg"),
        ("postgresql://u@h/db?password=secret&x=1", "postgresql://u@h/db?password=***&x=1"),
        ("postgresql://u@h/db?sslpassword=secret", "postgresql://u@h/db?sslpassword=***"),
        ("host=h user=u password=secret dbname=db", "host=h user=u password=*** dbname=db"),
        ("host=h password = secret", "host=h password = ***"),
        ("password='se cr\\'et' host=h", "password=*** host=h"),
        ("host=h sslpassword=secret", "host=h sslpassword=***"),
        ("host=h dbname=db", "host=h dbname=db"),
    ],
)
def test_redact_dsn(dsn: str, redacted: str) -> None:
    assert redact_dsn(dsn) == redacted
    assert "secret" not in redact_dsn(dsn)


def test_database_repr_hides_the_password() -> None:
    shown = repr(DatabaseConfig(dsn="postgresql://u:secret@h/db"))
    assert "secret" not in shown
    assert "postgresql://u:***@h/db" in shown


# --- Files ----------------------------------------------------------------------------------------


def test_load_config_from_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[worker]\nthreads = 4\n")
    cfg = load_config(path, env={})
    assert cfg.worker.threads == 4
    assert cfg.path == str(path)


def test_load_config_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[worker]\nthreads = 2\n")
    assert load_config(None, env={"PGTICK_CONFIG": str(path)}).worker.threads == 2


def test_no_file_at_the_default_place_means_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_load, "DEFAULT_CONFIG_PATH", str(tmp_path / "absent.toml"))
    assert load_config(None, env={}) == Config()


def test_file_at_the_default_place_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[worker]\nthreads = 3\n")
    monkeypatch.setattr(config_load, "DEFAULT_CONFIG_PATH", str(path))
    assert load_config(None, env={}).worker.threads == 3


@pytest.mark.parametrize("via_env", [False, True])
def test_a_named_file_that_is_missing_is_an_error(tmp_path: Path, via_env: bool) -> None:
    path = str(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=f"^{re.escape(path)}: cannot read config file: "):
        if via_env:
            load_config(None, env={"PGTICK_CONFIG": path})
        else:
            load_config(path, env={})


def test_a_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(str(tmp_path))}: cannot read config file"):
        load_config(tmp_path, env={})


def test_invalid_toml_names_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[worker]\nthreads = 8\nlease = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"{path}: not valid TOML: ")
    assert "line 3" in str(info.value)


def test_invalid_utf8_names_path(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_bytes(b"[worker]\n# \xff\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: not valid UTF-8"):
        load_config(path, env={})


def test_key_errors_from_a_file_name_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[worker]\nthreads = "eight"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value) == f'{path}: worker.threads: expected a positive integer, got "eight"'


def test_example_file_loads_and_shows_the_defaults() -> None:
    cfg = load_config(EXAMPLE, env={})
    defaults = Config()
    sections = ("database", "worker", "ticker", "metrics", "web", "logging", "tracing", "retention")
    for section in sections:
        assert getattr(cfg, section) == getattr(defaults, section), section
    assert cfg.job_types["hello"] == JobTypeConfig(name="hello", handler="pgtick.examples:hello")
    assert cfg.job_types["sleep"].handler == "pgtick.examples:sleep"
    assert cfg.job_types["cleanup"].command == ("/bin/sh", "-c", "cat >/dev/null; echo cleaned")
    every_minute = cfg.schedules["every_minute"]
    assert (every_minute.job_type, every_minute.cron) == ("hello", "* * * * *")
    assert every_minute == dataclasses.replace(
        ScheduleConfig(name="every_minute", job_type="hello", cron="* * * * *"),
        payload=every_minute.payload,
    )
    nightly = cfg.schedules["nightly_cleanup"]
    assert (nightly.job_type, nightly.timezone) == ("cleanup", "Europe/Amsterdam")


def test_example_file_documents_every_key() -> None:
    """Keys shown commented out (no default to show) count too."""
    uncommented = re.sub(r"^# (?=[a-z_]+ = )", "", EXAMPLE.read_text(), flags=re.MULTILINE)
    data = tomllib.loads(uncommented)
    assert set(data) == {
        "database",
        "worker",
        "ticker",
        "metrics",
        "web",
        "logging",
        "tracing",
        "retention",
        "job_types",
        "schedules",
    }
    for section, keys in config_schema.SECTIONS.items():
        assert set(data[section]) == set(keys), section
    assert set(data["job_types"]["hello"]) == set(config_schema.JOB_TYPE_KEYS) - {"command"}
    assert set(data["schedules"]["every_minute"]) == set(config_schema.SCHEDULE_KEYS)


class FakeLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def test_example_hello_logs_the_payload() -> None:
    ctx = types.SimpleNamespace(log=FakeLog(), cancelled=threading.Event())
    examples.hello(ctx, {"greeting": "hi"})
    assert ctx.log.lines == [("hello", {"greeting": "hi"})]


def test_example_sleep_returns_or_retries_when_cancelled() -> None:
    ctx = types.SimpleNamespace(log=FakeLog(), cancelled=threading.Event())
    examples.sleep(ctx, {"seconds": 0.01})
    ctx.cancelled.set()
    with pytest.raises(Retry):
        examples.sleep(ctx, {"seconds": 60})


def test_processes_auto_counts_the_cpus_this_process_may_use_and_is_the_default() -> None:
    cfg = load_text('[database]\ndsn = "postgresql:///x"\n[worker]\nprocesses = "auto"')
    assert cfg.worker.processes == "auto"
    assert cfg.worker.process_count == cpus_available()
    assert cpus_available() <= len(os.sched_getaffinity(0))
    default = load_text('[database]\ndsn = "postgresql:///x"').worker
    assert (default.processes, default.process_count) == ("auto", cpus_available())
    one = load_text('[database]\ndsn = "postgresql:///x"\n[worker]\nprocesses = 1').worker
    assert one.process_count == 1


def _cgroup(tmp_path: Path, path: str, limits: dict[str, str]) -> tuple[str, str]:
    """A fake /proc/self/cgroup naming ``path`` and a cgroup v2 tree with ``cpu.max`` files."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cgroup").write_text(f"1:cpu:/\n0::{path}\n")
    for where, text in limits.items():
        folder = tmp_path / "cg" / where.strip("/")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cpu.max").write_text(text + "\n")
    return str(tmp_path / "cg"), str(tmp_path / "proc")


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({}, None),  # no cpu.max anywhere (cgroup v1, or not mounted)
        ({"system.slice/pgtick.service": "max 100000"}, None),  # no CPUQuota=
        ({"system.slice/pgtick.service": "150000 100000"}, 2),  # CPUQuota=150%: rounded up
        ({"system.slice/pgtick.service": "100000 100000", "system.slice": "max 100000"}, 1),
        ({"system.slice/pgtick.service": "400000 100000", "system.slice": "50000 100000"}, 1),
        ({"system.slice/pgtick.service": "garbage"}, None),
    ],
)
def test_processes_auto_keeps_to_the_units_cpu_quota(
    tmp_path: Path, limits: dict[str, str], expected: int | None
) -> None:
    root, proc = _cgroup(tmp_path, "/system.slice/pgtick.service", limits)
    assert cgroup_cpu_quota(root, proc) == expected
    cpus = len(os.sched_getaffinity(0))
    assert cpus_available(root, proc) == (cpus if expected is None else min(cpus, expected))
