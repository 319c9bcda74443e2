"""The verbs on schedules: ``schedules`` (the listing), ``pause``, ``resume``, ``trigger``,
``next`` and ``backfill``; ``add``, ``edit`` and ``remove`` for those the database owns.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from pgtick.cli import context, views
from pgtick.cli.args import parse_payload, parse_step, parse_when, resolve_when
from pgtick.cli.exits import EXIT_OK
from pgtick.cli.render import iso, local_text, print_json, print_table, seconds_text
from pgtick.surfaces import operations

DEFAULT_NEXT_COUNT = 5
T = TypeVar("T")


def cmd_schedules(args: argparse.Namespace) -> int:
    lines = context.call(args, context.begin(args), operations.list_schedules)
    if args.json:
        print_json([views.schedule_fields(line) for line in lines])
    elif not lines:
        print("no schedules")
    else:
        print_table(views.SCHEDULE_COLUMNS, views.schedule_table(lines))
        invalid = [
            line.listing
            for line in lines
            if line.listing.paused
            and line.listing.paused_reason == operations.PAUSED_REASON_INVALID
        ]
        if invalid:
            print()
        for listing in invalid:
            # Too long for a column, and the one thing the operator needs to fix it.
            print(f"{listing.name} is paused as invalid: {listing.paused_detail or '(no detail)'}")
    return EXIT_OK


def _on_schedule(args: argparse.Namespace, verb: Callable[..., T]) -> T:
    """``verb(store, NAME, actor=...)``: pause, resume and trigger, recorded as this user's."""
    actor = operations.cli_actor()
    return context.call(
        args, context.begin(args), lambda store: verb(store, args.name, actor=actor)
    )


def cmd_schedules_pause(args: argparse.Namespace) -> int:
    _on_schedule(args, operations.pause_schedule)
    print(f"paused {args.name}")
    return EXIT_OK


def cmd_schedules_resume(args: argparse.Namespace) -> int:
    _on_schedule(args, operations.resume_schedule)
    print(f"resumed {args.name} (continues from now; the paused period is not caught up)")
    return EXIT_OK


def cmd_schedules_trigger(args: argparse.Namespace) -> int:
    run_id = _on_schedule(args, operations.trigger_schedule)
    print(run_id)
    return EXIT_OK


def cmd_schedules_next(args: argparse.Namespace) -> int:
    """From the config file when it declares the schedule, with no database at all; else
    from the database."""
    cfg = context.begin(args)
    start = datetime.now(UTC)
    if args.from_ is not None:
        start = resolve_when(parse_when(args.from_, "--from"), start, ahead=False)
    upcoming = operations.upcoming(cfg, args.name, start, args.count, dsn_override=args.dsn)
    for at, delay in upcoming.occurrences:
        line = f"{iso(at)}  {local_text(at, upcoming.zone)}"
        if delay > 0:
            line += f"  run_at +{seconds_text(delay)}"
        print(line)
    return EXIT_OK


def cmd_schedules_backfill(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    now = datetime.now(UTC)  # durations: before any database, on this machine's clock
    start = resolve_when(parse_when(args.from_, "--from"), now, ahead=False)
    end = resolve_when(parse_when(args.to, "--to"), now, ahead=False)
    after, end = operations.backfill_window(start, end, args.from_)
    actor = operations.cli_actor()
    done = context.call(
        args, cfg, lambda store: operations.backfill(store, args.name, after, end, actor=actor)
    )
    print(
        f"created {done.created} runs for {args.name} ({done.existing} occurrences already had one)"
    )
    if done.overlap == "skip" and done.created > 1:
        # The ticker's rule, not the claim's: backfilled runs are all due now.
        print(
            f'pgtick: warning: overlap = "skip" does not hold back backfilled runs: the'
            f" {done.created} are due at once (max_running = 1 on job type {done.job_type!r}"
            " runs them one at a time)",
            file=sys.stderr,
        )
    return EXIT_OK


# Options of `schedules add` and `edit`: (attribute, [schedules.NAME] key).
DEFINITION_OPTIONS = (
    ("job_type", "job_type"),
    ("cron", "cron"),
    ("timezone", "timezone"),
    ("catchup", "catchup"),
    ("catchup_limit", "catchup_limit"),
    ("overlap", "overlap"),
    ("on_pause", "on_pause"),
    ("jitter", "jitter"),
    ("max_attempts", "max_attempts"),
    ("priority", "priority"),
    ("after", "after"),
    ("after_deadline", "after_deadline"),
    ("after_missed", "after_missed"),
)


def _definition(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, as a [schedules.NAME] table has them."""
    table = {key: getattr(args, attr) for attr, key in DEFINITION_OPTIONS}
    table = {key: value for key, value in table.items() if value is not None}
    if args.payload is not None:
        table["payload"] = parse_payload(args.payload)
    for option, key in (("--on-success", "on_success"), ("--on-dead", "on_dead")):
        if getattr(args, key) is not None:
            table[key] = parse_step(option, getattr(args, key))
    return table


def cmd_schedules_add(args: argparse.Namespace) -> int:
    table = _definition(args)
    actor = operations.cli_actor()
    schedule_id = context.call(
        args,
        context.begin(args),
        lambda store: operations.add_schedule(store, args.name, table, actor),
    )
    print(
        f"added {args.name} (schedule {schedule_id}, owned by the database: no config sync "
        "changes it)"
    )
    return EXIT_OK


def cmd_schedules_edit(args: argparse.Namespace) -> int:
    table = _definition(args)
    actor = operations.cli_actor()
    context.call(
        args,
        context.begin(args),
        lambda store: operations.edit_schedule(store, args.name, table, actor),
    )
    print(f"changed {args.name} ({', '.join(sorted(table))})")
    return EXIT_OK


def cmd_schedules_remove(args: argparse.Namespace) -> int:
    actor = operations.cli_actor()
    context.call(
        args,
        context.begin(args),
        lambda store: operations.remove_schedule(store, args.name, actor),
    )
    print(f"removed {args.name} (paused as removed; its runs keep their history)")
    return EXIT_OK
