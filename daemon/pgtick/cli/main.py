"""The ``pgtick`` command line: argument parsing and printing, no SQL, no business rules.

Exit codes, mapped from the exception tree in one place (``exit_code``): 0 ok, 1 runtime
failure, 2 usage or config error, 3 database unreachable, 4 not found; and 5 from ``status``
when something needs attention.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import zoneinfo
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn

import structlog

import pgtick
from pgtick.config import load as config_mod
from pgtick.core import handlers, ticker
from pgtick.errors import (
    ConfigError,
    DatabaseError,
    MigrationError,
    NotFoundError,
    PgtickError,
    ScheduleError,
    SchemaOutdatedError,
    UsageError,
)
from pgtick.observability import logs
from pgtick.scheduling.cron import Cron
from pgtick.storage import db, migrate
from pgtick.storage import store as store_mod
from pgtick.storage.store import NewRun, RunStore, ScheduleListing
from pgtick.surfaces import operations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_NOT_FOUND = 4
EXIT_ATTENTION = 5

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, EXIT_USAGE),
    (MigrationError, EXIT_USAGE),
    (SchemaOutdatedError, EXIT_USAGE),
    (DatabaseError, EXIT_DATABASE),
    (NotFoundError, EXIT_NOT_FOUND),
    (PgtickError, EXIT_FAILURE),
)
DEMO_DATA_DIR = ".pgdata"
DEMO_WEB_LISTEN = "127.0.0.1:8089"  # `pgtick demo` serves the console here unless web.listen is set
# `pgtick demo` enqueues one run of this job type at start when its config declares it.
DEMO_JOB_TYPE = "hello"
DEMO_PAYLOAD = {"greeting": "hello from pgtick demo"}
DEFAULT_NEXT_COUNT = 5
# `schedules next --count` and `schedules backfill` refuse more occurrences than this: a typo in
# a range ("2016" for "2026") should not enqueue ten years of runs.
MAX_OCCURRENCES = 10_000
# schedules.paused_reason of a schedule the daemon paused because it vanished from its config,
# and of one it paused because it cannot compute it (the reason is in paused_detail).
PAUSED_REASON_REMOVED = "removed"
PAUSED_REASON_INVALID = "invalid"


def exit_code(exc: BaseException) -> int:
    """The documented exit code for an error."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILURE


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


@contextlib.contextmanager
def _opened_store(dsn: str, schema: str) -> Iterator[RunStore]:
    """A one-connection store for one command, closed however the command ends."""
    store = _store(dsn, schema)
    try:
        yield store
    finally:
        store.pool.close()


WHEN_HELP = "ISO 8601 time (no offset = UTC) or a duration such as 90m, 2h, 7d"


def parse_time(text: str, option: str) -> datetime:
    """An ISO 8601 instant; without an offset it is taken as UTC."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option}: not an ISO 8601 time: {text!r} (e.g. 2026-11-22T09:00:00+01:00)"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def parse_when(text: str, option: str) -> datetime | timedelta:
    """The one parser of time arguments: an ISO 8601 instant (no offset = UTC) or a duration,
    which the option reads as "that long ago" (--since, --older-than) or "that long from now"
    (--run-at, --in)."""
    try:
        return timedelta(seconds=config_mod.parse_duration(text, option))
    except ConfigError:
        pass
    try:
        return parse_time(text, option)
    except UsageError:
        raise UsageError(
            f"{option}: not an ISO 8601 time or a duration: {text!r} (e.g. "
            "2026-11-22T09:00:00+01:00, no offset = UTC; or 90m, 2h, 7d)"
        ) from None


def resolve_when(when: datetime | timedelta, now: datetime, *, ahead: bool) -> datetime:
    """An instant from ``parse_when``: a duration counts from ``now``, forward when ``ahead``."""
    if isinstance(when, datetime):
        return when
    try:
        return now + when if ahead else now - when
    except OverflowError:
        raise UsageError(f"duration out of range: {when}") from None


def _no_constant(name: str) -> NoReturn:
    raise UsageError(f"--payload: JSON has no {name} (PostgreSQL's jsonb refuses it)")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def parse_payload(text: str | None) -> dict[str, Any]:
    """A --payload argument (``-`` reads stdin) as a JSON object that jsonb will take."""
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read(operations.MAX_PAYLOAD_BYTES * 4 + 1)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > operations.MAX_PAYLOAD_BYTES:
        raise UsageError(
            f"--payload: {size} bytes, more than the {operations.MAX_PAYLOAD_BYTES // 1024} KiB"
            " (1 MiB) pgtick enqueue accepts: keep big data elsewhere and pass a reference"
        )
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload: invalid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"--payload: must be a JSON object, got {type(value).__name__}")
    if _has_nul(value):
        raise UsageError("--payload: a NUL character (\\u0000), which jsonb refuses")
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


def cmd_grants(args: argparse.Namespace) -> int:
    if args.schema is None:
        schema = _load(args).database.schema
    else:
        schema = config_mod.schema_name("--schema", args.schema)
    statements = migrate.grants_sql(args.role, schema)
    print(
        f"-- pgtick: what role {args.role!r} needs to run `pgtick run` and the operator verbs on"
        f" schema {schema!r}.\n-- Run as the schema owner (e.g. psql -f), after every"
        " `pgtick migrate`; create the role first (CREATE ROLE ... LOGIN PASSWORD ...)."
    )
    print(statements)
    return EXIT_OK


def _config_source(cfg: config_mod.Config) -> str:
    """Which config file is in use, or where none was found."""
    if cfg.path is not None:
        return cfg.path
    return (
        f"no config file ({config_mod.DEFAULT_CONFIG_PATH} does not exist; "
        f"--config and ${config_mod.CONFIG_PATH_ENV} not given)"
    )


def cmd_check(args: argparse.Namespace) -> int:
    _quiet_logging(args)
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
    print(f"config: {_config_source(cfg)}" + ("" if cfg.path else "; checking the defaults"))
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
    what = "config OK" if cfg.path else "defaults OK (no config file)"
    print(f"{what}: {len(job_types)} job types, {len(cfg.schedules)} schedules")
    return EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    operations.check_new_run(args.job_type, args.key)
    payload = parse_payload(args.payload)
    when: datetime | timedelta | None = None
    if args.run_at is not None:
        when = parse_when(args.run_at, "--run-at")
    elif args.in_ is not None:
        when = timedelta(seconds=config_mod.parse_duration(args.in_, "--in"))
    if not operations.declares_job_type(cfg, args.job_type):
        # Still enqueued: a daemon with another config (another fleet) may handle it.
        print(
            f"pgtick: warning: job type {args.job_type!r} is not declared in "
            f"{_config_source(cfg)}; enqueued anyway, but no daemon with this config will run"
            " it (`pgtick status` lists job types no live daemon handles)",
            file=sys.stderr,
        )
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        # A duration counts from the database's clock, like every time pgtick compares.
        run_at = store.now() + when if isinstance(when, timedelta) else when
        run_id = store.enqueue(NewRun(args.job_type, payload, run_at, args.key, args.max_attempts))
    print(run_id)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from pgtick.embedded import EmbeddedPostgres
    from pgtick.service import Service

    cfg = _load(args)
    if not cfg.web.enabled:
        cfg = dataclasses.replace(cfg, web=dataclasses.replace(cfg.web, listen=DEMO_WEB_LISTEN))
    logs.configure_logging(cfg.logging.format, "debug" if args.debug else cfg.logging.level)
    server = EmbeddedPostgres(Path(args.data_dir))
    try:
        print(f"PGTICK_DSN={server.dsn}", flush=True)
        print(f"console: http://{cfg.web.listen}/", flush=True)
        if DEMO_JOB_TYPE in cfg.job_types:
            # One run due now, so the first success shows within seconds, not at the schedule's
            # next minute.
            migrate.migrate(server.dsn, cfg.database.schema)
            with _opened_store(server.dsn, cfg.database.schema) as store:
                store.enqueue(NewRun(DEMO_JOB_TYPE, DEMO_PAYLOAD))
        return Service(cfg, server.dsn, apply_migrations=True, log_each_run=True).run()
    finally:
        server.close()


# -- schedules -------------------------------------------------------------------------------------


def _iso(value: datetime | None, *, whole_seconds: bool = False) -> str | None:
    """An instant as UTC ISO 8601 (None stays None); ``whole_seconds`` for aligned tables."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return (utc.replace(microsecond=0) if whole_seconds else utc).isoformat()


def _offset_text(offset: timedelta | None) -> str:
    """A UTC offset the way ISO 8601 writes it: ``+02:00``, ``+05:45``, ``-03:30``."""
    total = round((offset or timedelta(0)).total_seconds())
    hours, rest = divmod(abs(total), 3600)
    minutes, seconds = divmod(rest, 60)
    text = f"{'-' if total < 0 else '+'}{hours:02d}:{minutes:02d}"
    return f"{text}:{seconds:02d}" if seconds else text


def _local_text(at: datetime, cron: Cron) -> str:
    """What the schedule's wall clock shows at ``at``: ``2026-10-25 02:30:00 CEST (+02:00)``;
    the offset tells the two passes of a repeated hour apart."""
    local = at.astimezone(cron.zone)
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({_offset_text(local.utcoffset())})"


def _seconds_text(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _cron(name: str, expr: str, timezone: str) -> Cron:
    """The ticker's own parsed cron, so that what is printed is what gets materialized."""
    try:
        return ticker.cron_for(expr, timezone, name)
    except ScheduleError as exc:
        raise ScheduleError(f"schedule {name!r}: {exc}") from None


def _not_found(name: str) -> NotFoundError:
    return NotFoundError(f"schedule {name!r} not found")


def _state(listing: ScheduleListing) -> str:
    if not listing.paused:
        return "active"
    if listing.paused_reason == PAUSED_REASON_REMOVED:
        return "paused (gone from config)"
    if listing.paused_reason == PAUSED_REASON_INVALID:
        return "paused (invalid)"
    return "paused"


def _next_at(listing: ScheduleListing, now: datetime) -> datetime | None:
    """An active schedule's next occurrence after the database's now; None when paused (or
    when a newer pgtick stored an expression this one refuses: the listing still prints)."""
    if listing.paused:
        return None
    try:
        return ticker.cron_for(listing.cron, listing.timezone, listing.name).next_after(now)
    except ScheduleError:
        return None


def _listing_fields(listing: ScheduleListing, now: datetime) -> dict[str, Any]:
    return {
        "name": listing.name,
        "job_type": listing.job_type,
        "cron": listing.cron,
        "timezone": listing.timezone,
        "state": _state(listing),
        "paused_reason": listing.paused_reason,
        "paused_detail": listing.paused_detail,
        "next_at": _iso(_next_at(listing, now)),
        "last_status": listing.last_status,
        "last_scheduled_for": _iso(listing.last_scheduled_for),
        "last_success_at": _iso(listing.last_success_at),
    }


SCHEDULE_COLUMNS = ("NAME", "JOB TYPE", "CRON", "TIMEZONE", "STATE", "NEXT", "LAST RUN", "LAST OK")


def _listing_cells(listing: ScheduleListing, now: datetime) -> tuple[str, ...]:
    last_run = "-"
    if listing.last_status is not None:
        # A triggered run has no occurrence.
        when = _iso(listing.last_scheduled_for, whole_seconds=True) or "(triggered)"
        last_run = f"{listing.last_status} {when}"
    return (
        listing.name,
        listing.job_type,
        listing.cron,
        listing.timezone,
        _state(listing),
        _iso(_next_at(listing, now), whole_seconds=True) or "-",
        last_run,
        _iso(listing.last_success_at, whole_seconds=True) or "-",
    )


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    lines = [header, *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


def cmd_schedules(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        listings = store.list_schedules()
        now = store.now()
    if args.json:
        print(json.dumps([_listing_fields(s, now) for s in listings], indent=2))
    elif not listings:
        print("no schedules")
    else:
        _print_table(SCHEDULE_COLUMNS, [_listing_cells(s, now) for s in listings])
        invalid = [s for s in listings if s.paused and s.paused_reason == PAUSED_REASON_INVALID]
        if invalid:
            print()
        for listing in invalid:
            # Too long for a column, and the one thing the operator needs to fix it.
            print(f"{listing.name} is paused as invalid: {listing.paused_detail or '(no detail)'}")
    return EXIT_OK


def cmd_schedules_pause(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        found = store.pause_schedule(args.name)
    if not found:
        raise _not_found(args.name)
    print(f"paused {args.name}")
    return EXIT_OK


def cmd_schedules_resume(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        found = store.resume_schedule(args.name)
    if not found:
        raise _not_found(args.name)
    print(f"resumed {args.name} (continues from now; the paused period is not caught up)")
    return EXIT_OK


def cmd_schedules_trigger(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        run_id = store.trigger_schedule(args.name)
    if run_id is None:
        raise _not_found(args.name)
    print(run_id)
    return EXIT_OK


def _schedule_for_next(args: argparse.Namespace, cfg: config_mod.Config) -> tuple[Cron, float]:
    """The cron and jitter of the schedule to show: from the config file when it is declared
    there, with no database at all (the config is the source of truth for its schedules); else
    from the database."""
    declared = cfg.schedules.get(args.name)
    if declared is not None:
        return _cron(declared.name, declared.cron, declared.timezone), declared.jitter_seconds
    try:
        dsn = _dsn(args, cfg)
    except ConfigError as exc:
        where = cfg.path or "the config file"
        raise ConfigError(
            f"schedule {args.name!r} is not declared in {where}; to look it up in the "
            f"database: {exc}"
        ) from None
    with _opened_store(dsn, cfg.database.schema) as store:
        row = store.get_schedule(args.name)
    if row is None:
        where = f" ({cfg.path})" if cfg.path else ""
        raise NotFoundError(
            f"schedule {args.name!r} not found in the config file{where} or the database"
        )
    jitter = float(row["jitter_seconds"] or 0.0)
    return _cron(args.name, str(row["cron"]), str(row["timezone"])), jitter


def cmd_schedules_next(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    start = datetime.now(UTC)
    if args.from_ is not None:
        start = resolve_when(parse_when(args.from_, "--from"), start, ahead=False)
    if args.count > MAX_OCCURRENCES:
        raise UsageError(f"--count: at most {MAX_OCCURRENCES}, got {args.count}")
    cron, jitter = _schedule_for_next(args, cfg)
    for at in cron.next_n(start, args.count):
        line = f"{_iso(at)}  {_local_text(at, cron)}"
        delay = (ticker.with_jitter(cron, args.name, jitter, at).run_at - at).total_seconds()
        if delay > 0:
            line += f"  run_at +{_seconds_text(delay)}"
        print(line)
    return EXIT_OK


def _backfill_range(args: argparse.Namespace) -> tuple[datetime, datetime]:
    """The range as ``Cron.occurrences`` takes it, (after, until]: --from is inclusive too."""
    now = datetime.now(UTC)  # durations: before any database, on this machine's clock
    start = resolve_when(parse_when(args.from_, "--from"), now, ahead=False)
    end = resolve_when(parse_when(args.to, "--to"), now, ahead=False)
    if start >= end:
        raise UsageError(f"--from must be before --to (got --from {_iso(start)}, --to {_iso(end)})")
    try:
        return start - ticker.EPSILON, end  # occurrences are whole seconds
    except OverflowError:
        raise UsageError(f"--from: too early: {args.from_!r}") from None


def cmd_schedules_backfill(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    after, end = _backfill_range(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        row = store.get_schedule(args.name)
        if row is None:
            raise _not_found(args.name)
        now = store.now()
        if end > now:
            raise UsageError(
                f"--to: {_iso(end)} is after the database's now ({_iso(now, whole_seconds=True)})"
                "; backfill creates past occurrences, the ticker creates the rest"
            )
        cron = _cron(args.name, str(row["cron"]), str(row["timezone"]))
        occurrences = list(islice(cron.occurrences(after, end), MAX_OCCURRENCES + 1))
        if len(occurrences) > MAX_OCCURRENCES:
            raise UsageError(
                f"--from/--to: more than {MAX_OCCURRENCES} occurrences of {args.name} in that "
                "range; backfill it in parts"
            )
        created = store.backfill_schedule(args.name, occurrences) if occurrences else []
    existing = len(occurrences) - len(created)
    print(f"created {len(created)} runs for {args.name} ({existing} occurrences already had one)")
    return EXIT_OK


# -- runs ------------------------------------------------------------------------------------------

RUN_COLUMNS = (
    "ID",
    "JOB TYPE",
    "STATUS",
    "ATT",
    "RUN_AT",
    "STARTED",
    "FINISHED",
    "TOOK",
    "LAST ERROR",
)
MIN_ERROR_WIDTH = 10
MAX_JOB_TYPE_WIDTH = 16


def _utc(value: datetime | None, now: datetime) -> str:
    """A table cell in UTC, as precise as it needs to be next to ``now`` (like ``ls -l``):
    ``14:03:07`` today, ``01-05 12:00`` this year, ``2025-12-31`` before."""
    if value is None:
        return "-"
    at, today = value.astimezone(UTC), now.astimezone(UTC)
    if at.date() == today.date():
        return f"{at:%H:%M:%S}"
    if at.year == today.year:
        return f"{at:%m-%d %H:%M}"
    return f"{at:%Y-%m-%d}"


def _duration_text(seconds: float) -> str:
    """Short and sortable by eye: 0.25s, 42s, 3m05s, 2h01m, 3d04h."""
    if seconds < 10:
        return f"{seconds:.2f}s"
    whole = round(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}{(whole % size) // sub_size:02d}{sub}"
    if whole >= 60:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole}s"


def _run_seconds(run: store_mod.RunSummary) -> float | None:
    """How long the run ran (so far, if it is running)."""
    if run.started_at is None:
        return None
    end = run.finished_at if run.finished_at is not None else run.db_now
    if run.status != "running" and run.finished_at is None:
        return None  # failed, awaiting retry: the attempt's end is in `show`
    return max(0.0, (end - run.started_at).total_seconds())


def _attempts_text(attempts: int, max_attempts: int | None) -> str:
    return f"{attempts}/{'-' if max_attempts is None else max_attempts}"


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _summary_fields(run: store_mod.RunSummary) -> dict[str, Any]:
    return {
        "id": run.id,
        "job_type": run.job_type,
        "status": run.status,
        "attempts": run.attempts,
        "max_attempts": run.max_attempts,
        "schedule": run.schedule,
        "run_at": _iso(run.run_at),
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "duration_seconds": _run_seconds(run),
        "last_error": run.last_error,
    }


def _print_runs(runs: Sequence[store_mod.RunSummary]) -> None:
    """Aligned columns; the last error gets whatever the terminal has left."""
    rows = [
        (
            str(r.id),
            _cut(r.job_type, MAX_JOB_TYPE_WIDTH),
            r.status,
            _attempts_text(r.attempts, r.max_attempts),
            _utc(r.run_at, r.db_now),
            _utc(r.started_at, r.db_now),
            _utc(r.finished_at, r.db_now),
            "-" if (d := _run_seconds(r)) is None else _duration_text(d),
        )
        for r in runs
    ]
    fixed = [max(len(line[i]) for line in [RUN_COLUMNS[:-1], *rows]) for i in range(len(rows[0]))]
    room = shutil.get_terminal_size().columns - sum(fixed) - 2 * len(fixed)
    if room < MIN_ERROR_WIDTH:
        room = 0  # no room for a readable error: `pgtick show ID` has it
    errors = [_cut(_one_line(r.last_error), room) or "-" for r in runs]
    _print_table(RUN_COLUMNS, [(*row, e) for row, e in zip(rows, errors, strict=True)])


def cmd_runs(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    since = None if args.since is None else parse_when(args.since, "--since")
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        page = operations.list_runs(
            store,
            statuses=args.status or (),
            job_type=args.type,
            schedule=args.schedule,
            since=since,
            before=args.before,
            limit=args.limit,
        )
    if args.json:
        doc = {"runs": [_summary_fields(r) for r in page.runs], "next_before": page.next_before}
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    if not page.runs:
        print("no runs")
        return EXIT_OK
    _print_runs(page.runs)
    if page.next_before is not None:
        print(f"more: --before {page.next_before}")
    return EXIT_OK


# -- show ------------------------------------------------------------------------------------------


def _in_zone(at: datetime, timezone: str) -> str:
    """``at`` on a zone's wall clock (``2026-10-25 02:30:00 CEST (+02:00)``); empty for a zone
    this machine does not know."""
    try:
        local = at.astimezone(zoneinfo.ZoneInfo(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return ""
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()} ({_offset_text(local.utcoffset())})"


def _attempt_seconds(a: store_mod.Attempt) -> float | None:
    return None if a.finished_at is None else (a.finished_at - a.started_at).total_seconds()


def _detail_fields(d: operations.RunDetail) -> dict[str, Any]:
    r = d.run
    return {
        "id": r.id,
        "job_type": r.job_type,
        "status": r.status,
        "payload": r.payload,
        "idempotency_key": r.idempotency_key,
        "attempts": r.attempts,
        "max_attempts": r.max_attempts,
        "run_at": _iso(r.run_at),
        "scheduled_for": _iso(r.scheduled_for),
        "created_at": _iso(r.created_at),
        "updated_at": _iso(r.updated_at),
        "started_at": _iso(r.started_at),
        "finished_at": _iso(r.finished_at),
        "locked_by": r.locked_by,
        "locked_until": _iso(r.locked_until),
        "last_error": r.last_error,
        "error_type": r.error_type,
        "attempt_history": [
            {
                "attempt": a.attempt,
                "worker": a.worker_id,
                "started_at": _iso(a.started_at),
                "finished_at": _iso(a.finished_at),
                "duration_seconds": _attempt_seconds(a),
                "outcome": a.outcome,
                "error_type": a.error_type,
                "error": a.error,
            }
            for a in d.attempts
        ],
        "schedule": None
        if d.schedule is None
        else {
            "name": d.schedule.name,
            "cron": d.schedule.cron,
            "timezone": d.schedule.timezone,
            "scheduled_for_local": None
            if r.scheduled_for is None
            else _in_zone(r.scheduled_for, d.schedule.timezone) or None,
        },
        "effects": [{"key": e.key, "created_at": _iso(e.created_at)} for e in d.effects],
    }


def _print_detail(d: operations.RunDetail) -> None:
    r = d.run
    tried = _attempts_text(r.attempts, r.max_attempts)
    print(f"run {r.id}: {r.job_type}, {r.status}, attempt {tried}")
    held = None if r.locked_by is None else f"{r.locked_by} until {_iso(r.locked_until)}"
    error = None if r.last_error is None else f"[{r.error_type}] {_one_line(r.last_error)}"
    lines: list[tuple[str, str | None]] = [
        ("payload", json.dumps(r.payload)),
        ("idempotency key", r.idempotency_key),
        ("created", _iso(r.created_at)),
        ("run_at", _iso(r.run_at)),
        ("started", _iso(r.started_at)),
        ("finished", _iso(r.finished_at)),
        ("locked by", held),
        ("last error", error),
    ]
    if d.schedule is not None:
        s = d.schedule
        origin = f"{s.name} ({s.cron}, {s.timezone})"
        if r.scheduled_for is not None:
            origin += f", occurrence {_iso(r.scheduled_for)}"
            local = _in_zone(r.scheduled_for, s.timezone)
            if local:
                origin += f" = {local}"
        else:
            origin += ", triggered by hand"
        lines.append(("schedule", origin))
    for label, value in lines:
        if value is not None:
            print(f"  {label + ':':<17}{value}")
    print(f"attempts ({len(d.attempts)}):" if d.attempts else "attempts: none yet")
    for a in d.attempts:
        took = _attempt_seconds(a)
        outcome = a.outcome or "running"
        head = f"  #{a.attempt} {outcome} on {a.worker_id}, started {_iso(a.started_at)}"
        if took is not None:
            head += f", took {_duration_text(took)}"
        if a.error_type:
            head += f", {a.error_type}"
        print(head)
        for line in (a.error or "").rstrip().splitlines():
            print(f"      {line}")
    print(f"effects ({len(d.effects)}):" if d.effects else "effects: none")
    for e in d.effects:
        print(f"  {e.key}  ({_iso(e.created_at)})")


def cmd_show(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        detail = operations.show_run(store, args.run_id)
    if args.json:
        print(json.dumps(_detail_fields(detail), indent=2))
    else:
        _print_detail(detail)
    return EXIT_OK


# -- status ----------------------------------------------------------------------------------------


def _age_text(seconds: float | None) -> str:
    return "-" if seconds is None else _duration_text(max(0.0, seconds))


def _status_fields(st: operations.Status) -> dict[str, Any]:
    return {
        "healthy": st.healthy,
        "problems": st.problems,
        "db_now": _iso(st.db_now),
        "stale_after_seconds": st.stale_after_seconds,
        "workers": [
            {
                "id": w.worker.id,
                "host": w.worker.hostname,
                "pid": w.worker.pid,
                "version": w.worker.version,
                "threads": w.worker.threads,
                "busy": w.worker.busy,
                "job_types": list(w.worker.job_types),
                "started_at": _iso(w.worker.started_at),
                "heartbeat_age_seconds": w.worker.heartbeat_age_seconds,
                "stale": w.stale,
            }
            for w in st.workers
        ],
        "job_types": [
            {
                "job_type": t.stats.job_type,
                "due": t.stats.due,
                "oldest_due_seconds": t.stats.oldest_due_seconds,
                "scheduled": t.stats.scheduled,
                "running": t.stats.running,
                "stuck": t.stats.stuck,
                "awaiting_retry": t.stats.awaiting_retry,
                "dead_24h": t.stats.dead_recent,
                "live_workers": t.live_workers,
                "unserved": t.unserved,
            }
            for t in st.job_types
        ],
        "schedules": [
            {
                "name": s.state.name,
                "job_type": s.state.job_type,
                "cron": s.state.cron,
                "timezone": s.state.timezone,
                "next_at": _iso(s.next_at),
                "next_at_local": None
                if s.next_at is None
                else _in_zone(s.next_at, s.state.timezone) or None,
                "last_success_at": _iso(s.last_success_at),
                "overdue": s.overdue,
                "paused": s.state.paused,
                "paused_reason": s.state.paused_reason,
                "paused_detail": s.state.paused_detail,
                "error": s.error,
            }
            for s in st.schedules
        ],
    }


def _local_short(at: datetime, timezone: str) -> str:
    try:
        local = at.astimezone(zoneinfo.ZoneInfo(timezone))
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return "?"
    return f"{local:%m-%d %H:%M} {local.tzname()}"


def _schedule_state_text(s: operations.ScheduleStatus) -> str:
    if s.state.paused:
        why = s.state.paused_reason or "operator"
        detail = f": {_one_line(s.state.paused_detail)}" if s.state.paused_detail else ""
        return _cut(f"paused ({why}{detail})", 40)
    if s.error is not None:
        return _cut(f"INVALID: {_one_line(s.error)}", 40)
    return "OVERDUE" if s.overdue else "ok"


def _print_status(st: operations.Status) -> None:
    verdict = "ok" if st.healthy else f"ATTENTION ({len(st.problems)})"
    print(f"pgtick status at {_iso(st.db_now, whole_seconds=True)}: {verdict}")
    for problem in st.problems:
        print(f"  ! {problem}")
    live = sum(1 for w in st.workers if not w.stale)
    print()
    print(f"workers: {live} live, {len(st.workers) - live} stale")
    if st.workers:
        rows = [
            (
                w.worker.hostname,
                str(w.worker.pid),
                w.worker.version,
                f"{w.worker.busy}/{w.worker.threads}",
                _age_text(w.worker.heartbeat_age_seconds) + (" STALE" if w.stale else ""),
                _cut(",".join(w.worker.job_types) or "(schedules only)", 40),
            )
            for w in st.workers
        ]
        _print_table(
            ("  HOST", "PID", "VERSION", "BUSY", "HEARTBEAT", "JOB TYPES"),
            [("  " + r[0], *r[1:]) for r in rows],
        )
    print()
    print("job types:" if st.job_types else "job types: no queued, running or recently dead runs")
    if st.job_types:
        _print_table(
            ("  JOB TYPE", "DUE", "OLDEST", "RUNNING", "STUCK", "RETRYING", "DEAD 24H", "DAEMONS"),
            [
                (
                    "  " + _cut(t.stats.job_type, 30),
                    str(t.stats.due),
                    _age_text(t.stats.oldest_due_seconds),
                    str(t.stats.running),
                    str(t.stats.stuck),
                    str(t.stats.awaiting_retry),
                    str(t.stats.dead_recent),
                    "NONE" if t.unserved else str(t.live_workers),
                )
                for t in st.job_types
            ],
        )
    print()
    print("schedules:" if st.schedules else "schedules: none")
    if st.schedules:
        _print_table(
            ("  NAME", "NEXT (UTC)", "NEXT (LOCAL)", "LAST SUCCESS", "STATE"),
            [
                (
                    "  " + _cut(s.state.name, 24),
                    "-" if s.next_at is None else f"{s.next_at.astimezone(UTC):%m-%d %H:%M}",
                    "-" if s.next_at is None else _local_short(s.next_at, s.state.timezone),
                    _utc(s.last_success_at, st.db_now),
                    _schedule_state_text(s),
                )
                for s in st.schedules
            ],
        )


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        st = operations.status(
            store,
            heartbeat_seconds=cfg.worker.heartbeat_seconds,
            tick_interval_seconds=cfg.ticker.interval_seconds,
        )
    if args.json:
        print(json.dumps(_status_fields(st), indent=2))
    else:
        _print_status(st)
    return EXIT_OK if st.healthy else EXIT_ATTENTION


# -- retry and cancel ------------------------------------------------------------------------------


def _confirm(question: str, count: int, yes: bool) -> bool:
    """Above the threshold a bulk change needs --yes, or a "y" typed at a terminal; with stdin
    not a terminal it is refused without --yes (a script must say what it means)."""
    if yes or count <= operations.CONFIRM_ABOVE_ROWS:
        return True
    if not sys.stdin.isatty():
        raise UsageError(
            f"{count} runs match, more than {operations.CONFIRM_ABOVE_ROWS}: pass --yes to "
            "confirm (stdin is not a terminal, so no prompt)"
        )
    answer = input(f"{question} [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _change(args: argparse.Namespace, action: operations.Action) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    bulk_flags = args.status is not None or args.type is not None or args.since is not None
    if args.run_ids and bulk_flags:
        raise UsageError(f"{action.verb}: give run ids or --status/--type, not both")
    if not args.run_ids and (args.status is None or args.type is None):
        raise UsageError(f"{action.verb}: give run ids, or both --status and --type")
    since = None if args.since is None else parse_when(args.since, "--since")
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        if args.run_ids:
            done = operations.change_runs(store, action, args.run_ids)
            print(f"{action.past} {len(done.changed)} run(s): {_ids(done.changed)}")
            if done.missed:
                raise PgtickError(
                    f"not {action.past}: {_ids(done.missed)} (their status changed meanwhile)"
                )
            return EXIT_OK
        bulk, count = operations.plan_bulk(store, action, args.status, args.type, since)
        question = f"{action.verb} {count} {args.status} runs of {args.type}?"
        if not _confirm(question, count, args.yes):
            print(f"nothing {action.past}")
            return EXIT_OK
        changed = operations.run_bulk(store, bulk)
    print(f"{action.past} {changed} run(s) ({args.status} {args.type})")
    return EXIT_OK


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids) or "-"


def cmd_retry(args: argparse.Namespace) -> int:
    return _change(args, operations.RETRY)


def cmd_cancel(args: argparse.Namespace) -> int:
    return _change(args, operations.CANCEL)


# -- prune -----------------------------------------------------------------------------------------


def cmd_prune(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _quiet_logging(args)
    older_than = None if args.older_than is None else parse_when(args.older_than, "--older-than")
    with _opened_store(_dsn(args, cfg), cfg.database.schema) as store:
        pruned = operations.prune(
            store,
            cfg.retention,
            older_than=older_than,
            statuses=args.status or (),
            dry_run=args.dry_run,
        )
    verb = "would delete" if pruned.dry_run else "deleted"
    for status, count in pruned.counts.items():
        age = config_mod.format_duration(pruned.older_than_seconds[status])
        print(f"{status:<10} {verb} {count} (finished more than {age} ago)")
    print(f"total      {verb} {pruned.total}")
    return EXIT_OK


# -- parsing ---------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake in one stderr line, not usage plus error, with the
    prefix every error has: ``pgtick: <command>: <option>: ...``."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("pgtick").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"pgtick: {where}{message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _run_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a run id: {text!r} (ids start at 1)")
    if value > operations.MAX_RUN_ID:
        raise argparse.ArgumentTypeError(f"not a run id: {text!r} (larger than any bigint)")
    return value


def _add_runs(sub: Any, common: argparse.ArgumentParser) -> None:
    text = "list runs, newest first, one page at a time"
    p = sub.add_parser("runs", parents=[common], help=text, description=text)
    p.set_defaults(func=cmd_runs)
    p.add_argument(
        "--status",
        action="append",
        metavar="S",
        help=f"only this status; repeatable ({', '.join(store_mod.STATUSES)})",
    )
    p.add_argument("--type", metavar="T", help="only this job type")
    p.add_argument("--schedule", metavar="NAME", help="only runs of this schedule")
    p.add_argument("--since", metavar="WHEN", help=f"created since: {WHEN_HELP} ago")
    p.add_argument(
        "--limit",
        type=_positive_int,
        default=operations.DEFAULT_PAGE_SIZE,
        metavar="N",
        help=f"page size (default {operations.DEFAULT_PAGE_SIZE})",
    )
    p.add_argument(
        "--before", type=_run_id, metavar="ID", help="the page below this run id (printed)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    p.epilog = "Table times are UTC (HH:MM:SS today, MM-DD HH:MM this year); --json gives ISO."


def _add_change(sub: Any, common: argparse.ArgumentParser, action: operations.Action) -> None:
    fn = cmd_retry if action is operations.RETRY else cmd_cancel
    after = "queued, due now" if action is operations.RETRY else "cancelled"
    text = (
        f"{action.verb} runs by id ({', '.join(action.accepts)} -> {after}), or in bulk with "
        "--status and --type"
    )
    p = sub.add_parser(action.verb, parents=[common], help=text, description=text)
    p.set_defaults(func=fn)
    p.add_argument("run_ids", nargs="*", type=_run_id, metavar="RUN_ID")
    p.add_argument(
        "--status", metavar="S", help=f"bulk: runs in this status ({'/'.join(action.accepts)})"
    )
    p.add_argument("--type", metavar="T", help="bulk: runs of this job type")
    p.add_argument("--since", metavar="WHEN", help=f"bulk: finished since ({WHEN_HELP} ago)")
    p.add_argument(
        "--yes",
        action="store_true",
        help=f"confirm a bulk change of more than {operations.CONFIRM_ABOVE_ROWS} runs",
    )


def _add_schedules(sub: Any, common: argparse.ArgumentParser) -> None:
    """``schedules`` lists; its verbs manage and inspect one schedule."""
    text = "list schedules (verbs: pause, resume, trigger, next, backfill)"
    p = sub.add_parser("schedules", parents=[common], help=text, description=text)
    p.set_defaults(func=cmd_schedules)
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")
    verbs = p.add_subparsers(dest="action", metavar="VERB")

    def verb(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
        v = verbs.add_parser(name, parents=[common], help=help, description=help)
        v.set_defaults(func=fn)
        v.add_argument("name", metavar="NAME", help="the schedule's name ([schedules.NAME])")
        return v

    verb("pause", cmd_schedules_pause, "stop creating runs for a schedule")
    verb("resume", cmd_schedules_resume, "resume a schedule from now (no catching up)")
    verb("trigger", cmd_schedules_trigger, "run a schedule now, once; prints the run id")
    v = verb("next", cmd_schedules_next, "print upcoming occurrences, in UTC and local time")
    v.add_argument(
        "--count",
        type=_positive_int,
        default=DEFAULT_NEXT_COUNT,
        metavar="N",
        help=f"how many (default {DEFAULT_NEXT_COUNT})",
    )
    v.add_argument("--from", dest="from_", metavar="WHEN", help=f"{WHEN_HELP} ago (default: now)")
    v = verb("backfill", cmd_schedules_backfill, "create runs for past occurrences in a range")
    v.add_argument(
        "--from", dest="from_", required=True, metavar="WHEN", help=f"inclusive: {WHEN_HELP} ago"
    )
    v.add_argument("--to", required=True, metavar="WHEN", help=f"inclusive: {WHEN_HELP} ago")


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
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
    parser = _Parser(
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
    add(
        "migrate",
        cmd_migrate,
        "apply database migrations (idempotent); run it as the schema owner, exit 2 otherwise",
    )
    p = add("grants", cmd_grants, "print the SQL granting a role what the daemon and CLI need")
    p.add_argument("role", metavar="ROLE", help="the role the daemon and the CLI log in as")
    p.add_argument(
        "--schema", metavar="S", help="the pgtick schema (default: the config's database.schema)"
    )
    p = add("check", cmd_check, "validate config, schedules and handlers")
    p.add_argument("--db", action="store_true", help="also check the database and its schema")
    p = add("enqueue", cmd_enqueue, "add a run; prints its id")
    p.add_argument("job_type", metavar="TYPE")
    p.add_argument(
        "--payload",
        metavar="JSON",
        help="a JSON object (default {}), at most 1 MiB; - reads it from stdin",
    )
    when = p.add_mutually_exclusive_group()
    when.add_argument("--run-at", metavar="WHEN", help=f"{WHEN_HELP} from now (default: now)")
    when.add_argument("--in", dest="in_", metavar="DURATION", help="from now, e.g. 90s, 5m, 2h")
    p.add_argument("--key", metavar="KEY", help="idempotency key")
    p.add_argument("--max-attempts", type=_positive_int, metavar="N")
    p = add(
        "status",
        cmd_status,
        "workers, queues and schedules on one screen; exit 5 when something needs attention",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    _add_runs(sub, common)
    _add_change(sub, common, operations.RETRY)
    _add_change(sub, common, operations.CANCEL)
    p = add("prune", cmd_prune, "delete old finished runs (and their attempts) in batches")
    p.add_argument(
        "--older-than",
        metavar="WHEN",
        help=f"finished before this: {WHEN_HELP} ago (default: the config's [retention])",
    )
    p.add_argument(
        "--status",
        action="append",
        metavar="S",
        help=f"only this status; repeatable ({', '.join(store_mod.TERMINAL_STATUSES)})",
    )
    p.add_argument("--dry-run", action="store_true", help="count only, delete nothing")
    p = add("show", cmd_show, "one run: its attempts and errors, schedule and effects")
    p.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    _add_schedules(sub, common)
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
