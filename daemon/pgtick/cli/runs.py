"""The verbs on runs: ``enqueue``, ``runs``, ``show``, ``logs``, ``retry``, ``cancel`` and
``prune``."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timedelta

from pgtick import config as config_mod
from pgtick.cli import context, views
from pgtick.cli.args import (
    parse_chain,
    parse_payload,
    parse_since,
    parse_when,
    trace_context,
)
from pgtick.cli.exits import EXIT_FAILURE, EXIT_OK
from pgtick.cli.render import ids_text, print_json
from pgtick.errors import PgtickError, UsageError
from pgtick.surfaces import operations


def cmd_enqueue(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    operations.check_new_run(args.job_type, args.key, args.concurrency_key)
    payload = parse_payload(args.payload)
    traceparent = trace_context(args.traceparent)
    follow = parse_chain(args.on_success, args.on_dead)
    when: datetime | timedelta | None = None
    if args.run_at is not None:
        when = parse_when(args.run_at, "--run-at")
    elif args.in_ is not None:
        when = timedelta(seconds=config_mod.parse_duration(args.in_, "--in"))
    declared = operations.declares_job_type(cfg, args.job_type)
    if not declared and cfg.worker.refuse_undeclared_job_types:
        why = "is not declared" if declared is False else "cannot be checked (imports failed)"
        raise UsageError(
            f"job type {args.job_type!r} {why} in {context.config_source(cfg)}, and "
            "worker.refuse_undeclared_job_types is set: declare [job_types.NAME] or a "
            "@pgtick.job in worker.imports"
        )
    if not declared:
        # Still enqueued: a daemon with another config (another fleet) may handle it.
        print(
            f"pgtick: warning: job type {args.job_type!r} is not declared in "
            f"{context.config_source(cfg)}; enqueued anyway, but no daemon with this config"
            " will run it (`pgtick status` lists job types no live daemon handles)",
            file=sys.stderr,
        )
    with context.store(args, cfg) as store:
        run_id = operations.enqueue(
            store,
            args.job_type,
            payload,
            when=when,
            idempotency_key=args.key,
            max_attempts=args.max_attempts,
            priority=args.priority,
            concurrency_key=args.concurrency_key,
            traceparent=traceparent,
            follow=follow,
            batch_id=args.batch,
        )
    print(run_id)
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    since = parse_since(args.since, "--since")
    with context.store(args, cfg) as store:
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
        runs = [views.summary_fields(r) for r in page.runs]
        print_json({"runs": runs, "next_before": page.next_before})
        return EXIT_OK
    if not page.runs:
        print("no runs")
        return EXIT_OK
    views.print_runs(page.runs)
    if page.next_before is not None:
        print(f"more: --before {page.next_before}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    limits = operations.flow_limits(cfg)
    detail = context.call(args, cfg, lambda s: operations.show_run(s, args.run_id, limits))
    if args.json:
        print_json(views.detail_fields(detail))
    else:
        views.print_detail(detail)
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    """What a run printed; with --follow, a running attempt's lines as they come, then exit 0
    if that attempt succeeded and 1 if it did not (failed, lost, released, cancelled)."""
    cfg = context.begin(args)

    def emit(line: operations.OutputLine) -> None:
        if args.json:
            print(json.dumps(views.output_fields(line)), flush=True)
        else:
            print(views.output_text(line), flush=True)

    with context.store(args, cfg) as store:
        if args.follow:
            number, outcome = operations.follow_output(
                store, args.run_id, args.attempt, args.stream, emit
            )
            run = operations.show_run(store, args.run_id).run
            print(f"pgtick: {views.attempt_ended(number, outcome, run)}", file=sys.stderr)
            return EXIT_OK if outcome == "succeeded" else EXIT_FAILURE
        lines = operations.run_output(store, args.run_id, args.attempt, args.stream)
    attempt = None
    for line in lines:
        if not args.json and args.attempt is None and line.attempt != attempt:
            attempt = line.attempt
            print(f"== attempt {attempt} ==")
        emit(line)
    return EXIT_OK


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
    cfg = context.begin(args)
    bulk_flags = args.status is not None or args.type is not None or args.since is not None
    if args.run_ids and bulk_flags:
        raise UsageError(f"{action.verb}: give run ids or --status/--type, not both")
    if not args.run_ids and (args.status is None or args.type is None):
        raise UsageError(f"{action.verb}: give run ids, or both --status and --type")
    since = parse_since(args.since, "--since")
    with context.store(args, cfg) as store:
        if args.run_ids:
            done = operations.change_runs(store, action, args.run_ids, actor=operations.cli_actor())
            print(f"{action.past} {len(done.changed)} run(s): {ids_text(done.changed)}")
            if done.missed:
                raise PgtickError(
                    f"not {action.past}: {ids_text(done.missed)} (their status changed meanwhile)"
                )
            return EXIT_OK
        bulk, count = operations.plan_bulk(store, action, args.status, args.type, since)
        question = f"{action.verb} {count} {args.status} runs of {args.type}?"
        if not _confirm(question, count, args.yes):
            print(f"nothing {action.past}")
            return EXIT_OK
        changed = operations.run_bulk(store, bulk, actor=operations.cli_actor())
    print(f"{action.past} {changed} run(s) ({args.status} {args.type})")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    return _change(args, operations.RETRY)


def cmd_cancel(args: argparse.Namespace) -> int:
    return _change(args, operations.CANCEL)


def cmd_prune(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    older_than = parse_since(args.older_than, "--older-than")
    with context.store(args, cfg) as store:
        pruned = operations.prune(
            store,
            cfg.retention,
            older_than=older_than,
            statuses=args.status or (),
            dry_run=args.dry_run,
            progress_stream=sys.stderr,
            actor=None if args.dry_run else operations.cli_actor(),
        )
    verb = "would delete" if pruned.dry_run else "deleted"
    for status, count in pruned.counts.items():
        age = config_mod.format_duration(pruned.older_than_seconds[status])
        print(f"{status:<10} {verb} {count} (finished more than {age} ago)")
    print(f"total      {verb} {pruned.total}")
    return EXIT_OK
