"""The ``pgtick`` command line: argument parsing and printing, no SQL, no business rules.

Exit codes (SPEC §8), mapped from the exception tree in one place (``exit_code``):
0 ok, 1 runtime failure, 2 usage or config error, 3 database unreachable, 4 not found.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog

import pgtick
from pgtick import config as config_mod
from pgtick import db, handlers, logs, migrate
from pgtick.errors import (
    ConfigError,
    DatabaseError,
    MigrationError,
    NotFoundError,
    PgtickError,
    SchemaOutdatedError,
)
from pgtick.store import NewRun, RunStore

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_NOT_FOUND = 4

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, EXIT_USAGE),
    (MigrationError, EXIT_USAGE),
    (SchemaOutdatedError, EXIT_USAGE),
    (DatabaseError, EXIT_DATABASE),
    (NotFoundError, EXIT_NOT_FOUND),
    (PgtickError, EXIT_FAILURE),
)
DEMO_DATA_DIR = ".pgdata"


def exit_code(exc: BaseException) -> int:
    """The documented exit code for an error."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILURE


class UsageError(ConfigError):
    """A command-line argument is wrong; the message names it."""


# -- shared helpers -----------------------------------------------------------------------------


def _load(args: argparse.Namespace) -> config_mod.Config:
    return config_mod.load_config(args.config)


def _dsn(args: argparse.Namespace, cfg: config_mod.Config) -> str:
    return config_mod.resolve_dsn(cfg.database, args.dsn)


def _quiet_logging(args: argparse.Namespace) -> None:
    """Operator commands log only problems, to stderr, readable."""
    logs.configure_logging("console", "debug" if args.debug else "warning", sys.stderr)


def _store(dsn: str, schema: str) -> RunStore:
    return RunStore(db.make_pool(dsn, schema, size=1, name="pgtick-cli"))


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 instant; without an offset it is taken as UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option}: not an ISO 8601 time: {text!r} (e.g. 2026-11-22T09:00:00+01:00)"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_payload(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload: invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--payload: must be a JSON object, got {type(value).__name__}")
    return value


# -- commands ------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from pgtick.service import Service

    cfg = _load(args)
    logs.configure_logging(cfg.logging.format, "debug" if args.debug else cfg.logging.level)
    dsn = _dsn(args, cfg)
    structlog.get_logger("pgtick").info(
        "starting", version=pgtick.__version__, dsn=config_mod.redact_dsn(dsn), config=cfg.path
    )
    return Service(cfg, dsn, apply_migrations=args.migrate).run()


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    applied = migrate.migrate(_dsn(args, cfg), cfg.database.schema)
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print(f"schema {cfg.database.schema!r} is up to date")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    job_types = handlers.resolve(cfg)
    for name, what in handlers.handler_summary(job_types).items():
        print(f"job type {name}: {what}")
    for name, schedule in sorted(cfg.schedules.items()):
        print(f"schedule {name}: {schedule.cron} ({schedule.timezone}) -> {schedule.job_type}")
    if args.db:
        dsn = _dsn(args, cfg)
        with db.connect(dsn, cfg.database.schema) as conn, db.wrap_errors("check"):
            migrate.check_current(conn, cfg.database.schema)
        print(f"database: reachable, schema {cfg.database.schema!r} up to date")
    print(f"config OK: {len(job_types)} job types, {len(cfg.schedules)} schedules")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    payload = parse_payload(args.payload)
    run_at: datetime | None = None
    if args.run_at is not None:
        run_at = parse_time(args.run_at, "--run-at")
    store = _store(_dsn(args, cfg), cfg.database.schema)
    try:
        if args.in_ is not None:
            delay = config_mod.parse_duration(args.in_, "--in")
            run_at = store.now() + timedelta(seconds=delay)
        run_id = store.enqueue(NewRun(args.job_type, payload, run_at, args.key, args.max_attempts))
    finally:
        store.pool.close()
    print(run_id)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pgtick.embedded import EmbeddedPostgres
    from pgtick.service import Service

    cfg = _load(args)
    logs.configure_logging(cfg.logging.format, "debug" if args.debug else cfg.logging.level)
    server = EmbeddedPostgres(Path(args.data_dir))
    try:
        print(f"PGTICK_DSN={server.dsn}", flush=True)
        return Service(cfg, server.dsn, apply_migrations=True).run()
    finally:
        server.close()


# -- parsing ---------------------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        default=argparse.SUPPRESS,
        help="config file (default: $PGTICK_CONFIG or /etc/pgtick/config.toml)",
    )
    common.add_argument(
        "--dsn", default=argparse.SUPPRESS, help="database DSN (overrides config; $PGTICK_DSN)"
    )
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="debug logging, tracebacks on error",
    )
    parser = argparse.ArgumentParser(
        prog="pgtick",
        description="Scheduled and deferred jobs out of the PostgreSQL you already have.",
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"pgtick {pgtick.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
        p = sub.add_parser(name, parents=[common], help=help, description=help)
        p.set_defaults(func=fn)
        return p

    p = add("run", cmd_run, "run the daemon")
    p.add_argument("--migrate", action="store_true", help="apply pending migrations first")
    add("migrate", cmd_migrate, "apply database migrations (idempotent)")
    p = add("check", cmd_check, "validate config, schedules and handlers")
    p.add_argument("--db", action="store_true", help="also check the database and its schema")
    p = add("enqueue", cmd_enqueue, "add a run; prints its id")
    p.add_argument("job_type", metavar="TYPE")
    p.add_argument("--payload", metavar="JSON", help="a JSON object (default {})")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", metavar="TIME", help="ISO 8601 time (default: now)")
    when.add_argument("--in", dest="in_", metavar="DURATION", help="e.g. 90s, 5m, 2h")
    p.add_argument("--key", metavar="KEY", help="idempotency key")
    p.add_argument("--max-attempts", type=_positive_int, metavar="N")
    p = add("demo", cmd_demo, "run the daemon on an embedded PostgreSQL, for a first look")
    p.add_argument("--data-dir", default=DEMO_DATA_DIR, help="where the embedded server lives")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, default in (("config", None), ("dsn", None), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except Exception as exc:
        if args.debug:
            raise
        prefix = "pgtick: " if isinstance(exc, PgtickError) else "pgtick: internal error: "
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"{prefix}{first}", file=sys.stderr)
        return exit_code(exc)
