"""The setup verbs: ``run`` and ``demo`` (which start the daemon), ``migrate``, ``grants`` and
``check``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import structlog

import pgtick
from pgtick import config as config_mod
from pgtick.cli import context, demo
from pgtick.cli.exits import EXIT_OK, EXIT_USAGE
from pgtick.observability import logs
from pgtick.surfaces import operations

DEMO_DATA_DIR = ".pgdata"
DEMO_WEB_LISTEN = "127.0.0.1:8089"  # `pgtick demo` serves the console here unless web.listen is set
# `pgtick demo` enqueues one run of this job type at start when its config declares it.
DEMO_JOB_TYPE = "hello"
DEMO_PAYLOAD = {"greeting": "hello from pgtick demo"}


def cmd_run(args: argparse.Namespace) -> int:
    from pgtick.service import Service

    cfg = context.load(args)
    logs.configure_logging(cfg.logging.format, "debug" if args.debug else cfg.logging.level)
    dsn = context.dsn(args, cfg)
    structlog.get_logger("pgtick").info(
        "starting", version=pgtick.__version__, dsn=config_mod.redact_dsn(dsn), config=cfg.path
    )
    return Service(cfg, dsn, apply_migrations=args.migrate).run()


def cmd_migrate(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    applied = operations.migrate(
        context.dsn(args, cfg), cfg.database.schema, force=args.force, progress_stream=sys.stderr
    )
    if applied:
        for name in applied:
            print(f"applied {name}")
    else:
        print(f"schema {cfg.database.schema!r} is up to date")
    return EXIT_OK


def cmd_grants(args: argparse.Namespace) -> int:
    if args.schema is None:
        schema = context.load(args).database.schema
    else:
        schema = config_mod.schema_name("--schema", args.schema)
    statements = operations.grants_sql(args.role, schema, monitor=args.monitor)
    print(
        f"-- pgtick: what role {args.role!r} needs to run `pgtick run` and the operator verbs on"
        f" schema {schema!r}.\n-- Run as the schema owner (e.g. psql -f), after every"
        " `pgtick migrate`; create the role first (CREATE ROLE ... LOGIN PASSWORD ...)."
    )
    if args.monitor:
        print(
            "-- The last line (pg_monitor: see every role's sessions holding the MVCC horizon)"
            " needs a superuser."
        )
    print(statements)
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    context.quiet_logging(args)
    try:
        cfg = config_mod.load_config(args.config, every_error=True)
    except config_mod.ConfigErrors as exc:
        # Every mistake at once, each on its own line, then how many (one mistake stays the
        # usual one line): fix them in one go.
        for message in exc.messages:
            print(f"pgtick: {message}", file=sys.stderr)
        if len(exc.messages) > 1:
            where = exc.messages[0].partition(": ")[0]
            print(f"pgtick: {where}: {len(exc.messages)} config errors", file=sys.stderr)
        return EXIT_USAGE
    source = context.config_source(cfg)
    print(f"config: {source}" + ("" if cfg.path else "; checking the defaults"))
    # What `pgtick run` refuses at start, by the same code (operations.startup_checks).
    job_types = operations.handler_summary(cfg)
    for name, what in job_types.items():
        print(f"job type {name}: {what}")
    for name, schedule in sorted(cfg.schedules.items()):
        print(f"schedule {name}: {schedule.cron} ({schedule.timezone}) -> {schedule.job_type}")
    if args.db:
        operations.check_database(context.dsn(args, cfg), cfg)
        print(f"database: reachable, schema {cfg.database.schema!r} up to date")
    what = "config OK" if cfg.path else "defaults OK (no config file)"
    print(f"{what}: {len(job_types)} job types, {len(cfg.schedules)} schedules")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pgtick.embedded import EmbeddedPostgres
    from pgtick.service import Service

    cfg, source = demo.load(args.config)
    cfg = demo.with_free_ports(cfg, DEMO_WEB_LISTEN)
    logs.configure_logging(cfg.logging.format, "debug" if args.debug else cfg.logging.level)
    server = EmbeddedPostgres(Path(args.data_dir))
    try:
        print(f"PGTICK_DSN={server.dsn}", flush=True)
        print("\n".join(demo.next_steps(cfg, server.dsn, source)), flush=True)
        if DEMO_JOB_TYPE in cfg.job_types:
            # One run due now, so the first success shows within seconds, not at the schedule's
            # next minute.
            operations.migrate(server.dsn, cfg.database.schema)
            with operations.open_store(server.dsn, cfg.database.schema) as store:
                operations.enqueue(store, DEMO_JOB_TYPE, DEMO_PAYLOAD)
        return Service(cfg, server.dsn, apply_migrations=True, log_each_run=True).run()
    finally:
        server.close()
