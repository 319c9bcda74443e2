"""The ``pgtick`` argument tree (argparse): every verb, its options and their help. A mistake
is one stderr line, ``pgtick: <command>: <option>: ...``, and exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Callable
from typing import Any, NoReturn

import pgtick
from pgtick.cli import audit, batches, controls, deploy, runs, schedules, setup, status
from pgtick.cli.exits import EXIT_USAGE
from pgtick.config import values as config_values
from pgtick.config.schema import MAX_PRIORITY
from pgtick.config.values import MAX_INT4
from pgtick.errors import ConfigError, UsageError
from pgtick.surfaces import operations

WHEN_HELP = "ISO 8601 time (no offset = UTC) or a duration such as 90m, 2h, 7d"
# argparse's own wording (3.11 quotes each choice; later versions may not)
_INVALID_CHOICE = re.compile(r"invalid choice: '?([^' ]+)'? \(choose from (.*)\)")
_CHOICE_NAMES = re.compile(r"[\w-]+")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake in one stderr line, not usage plus error, with the
    prefix every error has: ``pgtick: <command>: <option>: ...``."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("pgtick").strip()
        where = f"{command}: " if command else ""
        self.exit(EXIT_USAGE, f"pgtick: {where}{self._suggest(message)} (see {self.prog} --help)\n")

    def _suggest(self, message: str) -> str:
        """argparse's message, with "did you mean" for a mistyped command or option: the close
        match instead of the list of every choice."""
        choice = _INVALID_CHOICE.search(message)
        if choice:
            typed, listed = choice.group(1), _CHOICE_NAMES.findall(choice.group(2))
            close = difflib.get_close_matches(typed, listed, n=1)
            if close:
                return f"{message[: choice.start()]}unknown {typed!r}; did you mean {close[0]!r}?"
            return message
        unknown = _UNRECOGNIZED.search(message)
        if unknown:
            # Reported by the root parser for any verb's options: every verb's are candidates.
            options = sorted(_option_strings(self))
            for typed in unknown.group(1).split():
                close = difflib.get_close_matches(typed.partition("=")[0], options, n=1)
                if typed.startswith("--") and close:
                    return f"unknown option {typed!r}; did you mean {close[0]!r}?"
        return message


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """The long options of ``parser`` and of every verb under it."""
    found = {o for o in parser._option_string_actions if o.startswith("--")}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _option_strings(sub)
    return found


def _integer(text: str, wrong: str) -> int:
    """``int(text)``; otherwise the argparse error ``<wrong>: <text>``."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{wrong}: {text!r}") from None


def _positive_int(text: str) -> int:
    value = _integer(text, "not a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _max_attempts(text: str) -> int:
    """An attempt count: runs.max_attempts is an integer column."""
    value = _positive_int(text)
    if value > MAX_INT4:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_INT4} (an integer column), got {value}"
        )
    return value


def _priority(text: str) -> int:
    """A priority: any integer within ±MAX_PRIORITY (higher first)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if abs(value) > MAX_PRIORITY:
        raise argparse.ArgumentTypeError(
            f"must be between -{MAX_PRIORITY} and {MAX_PRIORITY}, got {value}"
        )
    return value


def _run_id(text: str) -> int:
    """A run id: the rule the console uses too (``operations.parse_run_id``)."""
    try:
        return operations.parse_run_id(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_runs(sub: Any, common: argparse.ArgumentParser) -> None:
    text = "list runs, newest first, one page at a time"
    p = sub.add_parser("runs", parents=[common], help=text, description=text)
    p.set_defaults(func=runs.cmd_runs)
    p.add_argument(
        "--status",
        action="append",
        metavar="S",
        help=f"only this status; repeatable ({', '.join(operations.STATUSES)})",
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
    fn = runs.cmd_retry if action is operations.RETRY else runs.cmd_cancel
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
    text = "list schedules (verbs: add, edit, remove, pause, resume, trigger, next, backfill)"
    p = sub.add_parser("schedules", parents=[common], help=text, description=text)
    p.set_defaults(func=schedules.cmd_schedules)
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")
    verbs = p.add_subparsers(dest="action", metavar="VERB")

    def verb(name: str, fn: Callable[[argparse.Namespace], int], help: str) -> Any:
        v = verbs.add_parser(name, parents=[common], help=help, description=help)
        v.set_defaults(func=fn)
        v.add_argument("name", metavar="NAME", help="the schedule's name ([schedules.NAME])")
        return v

    verb("pause", schedules.cmd_schedules_pause, "stop creating runs for a schedule")
    verb("resume", schedules.cmd_schedules_resume, "resume a schedule from now (no catching up)")
    verb("trigger", schedules.cmd_schedules_trigger, "run a schedule now, once; prints the run id")
    v = verb(
        "next", schedules.cmd_schedules_next, "print upcoming occurrences, in UTC and local time"
    )
    v.add_argument(
        "--count",
        type=_positive_int,
        default=schedules.DEFAULT_NEXT_COUNT,
        metavar="N",
        help=f"how many (default {schedules.DEFAULT_NEXT_COUNT})",
    )
    v.add_argument("--from", dest="from_", metavar="WHEN", help=f"{WHEN_HELP} ago (default: now)")
    v = verb(
        "backfill", schedules.cmd_schedules_backfill, "create runs for past occurrences in a range"
    )
    v.add_argument(
        "--from", dest="from_", required=True, metavar="WHEN", help=f"inclusive: {WHEN_HELP} ago"
    )
    v.add_argument("--to", required=True, metavar="WHEN", help=f"inclusive: {WHEN_HELP} ago")
    v = verb(
        "add",
        schedules.cmd_schedules_add,
        "create a schedule owned by the database (no config sync touches it)",
    )
    _definition_options(v, required=True)
    v = verb("edit", schedules.cmd_schedules_edit, "change a schedule created with add")
    _definition_options(v, required=False)
    verb("remove", schedules.cmd_schedules_remove, "remove a schedule created with add")


def _definition_options(v: argparse.ArgumentParser, *, required: bool) -> None:
    """``schedules add`` and ``edit``: the keys of a [schedules.NAME] table, checked as the
    config file's."""
    v.add_argument("--type", dest="job_type", required=required, metavar="T", help="job type")
    v.add_argument("--cron", required=required, metavar="EXPR", help="five-field cron expression")
    v.add_argument("--tz", dest="timezone", metavar="ZONE", help="IANA time zone (default UTC)")
    v.add_argument("--payload", metavar="JSON", help="a JSON object handed to the handler")
    v.add_argument("--catchup", metavar="latest|all|none", help="after downtime (default latest)")
    v.add_argument("--catchup-limit", type=_positive_int, metavar="N")
    v.add_argument("--overlap", metavar="skip|allow", help="default skip")
    v.add_argument(
        "--on-pause", metavar="hold|skip", help="while its job type is paused (default hold)"
    )
    v.add_argument("--jitter", metavar="DURATION", help="delay each run by up to this")
    v.add_argument("--max-attempts", type=_max_attempts, metavar="N")
    v.add_argument("--priority", type=_priority, metavar="N")
    clear = "" if required else " ('' removes it)"
    for outcome, verb in (("success", "succeeds"), ("dead", "is dead")):
        v.add_argument(
            f"--on-{outcome}",
            metavar="STEP",
            help=f"enqueued when one of its runs {verb}: a job type, or JSON (a step or a list"
            " of them; docs/composition.md)" + clear,
        )
    v.add_argument(
        "--after",
        metavar="SCHEDULE",
        help="each occurrence waits for this schedule's of the same period" + clear,
    )
    v.add_argument("--after-deadline", metavar="DURATION", help="with --after (default 1h)")
    v.add_argument("--after-missed", metavar="skip|run", help="with --after (default skip)")


def _rate(text: str) -> tuple[int, float]:
    """A rate as the config writes it: ``N/second``, ``N/minute`` or ``N/hour``."""
    try:
        limit, window = config_values.rate("rate", text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("rate: ")) from None
    return limit, window


def _add_controls(sub: Any, common: argparse.ArgumentParser) -> None:
    """``pause``, ``resume`` and ``limits``: a job type at runtime, on every daemon."""
    text = "pause a job type on every daemon: its runs stay queued until resume"
    p = sub.add_parser("pause", parents=[common], help=text, description=text)
    p.set_defaults(func=controls.cmd_pause)
    p.add_argument("job_type", metavar="TYPE")
    p.add_argument("--reason", metavar="TEXT", help="why (shown by status and the console)")
    text = "resume a paused job type: its runs are claimed again at once"
    p = sub.add_parser("resume", parents=[common], help=text, description=text)
    p.set_defaults(func=controls.cmd_resume)
    p.add_argument("job_type", metavar="TYPE")
    text = (
        "show a job type's limits with their source, or override them on every daemon from "
        "its next claim (the config's stay the default: --reset)"
    )
    p = sub.add_parser("limits", parents=[common], help=text, description=text)
    p.set_defaults(func=controls.cmd_limits)
    p.add_argument("job_type", metavar="TYPE")
    p.add_argument("--max-running", type=_positive_int, metavar="N", help="fleet-wide at once")
    p.add_argument("--max-running-per-key", type=_positive_int, metavar="N", help="at once per key")
    p.add_argument("--rate", type=_rate, metavar="N/UNIT", help="starts per second|minute|hour")
    p.add_argument("--rate-per-key", type=_rate, metavar="N/UNIT", help="the same per key")
    p.add_argument("--reset", action="store_true", help="back to the config's limits")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    text = "who did what, when, to which runs: the operators' actions, newest first"
    p = sub.add_parser("audit", parents=[common], help=text, description=text)
    p.set_defaults(func=audit.cmd_audit)
    p.add_argument("--since", metavar="WHEN", help=f"recorded since: {WHEN_HELP} ago")
    p.add_argument(
        "--limit", type=_positive_int, default=100, metavar="N", help="at most N (default 100)"
    )
    p.add_argument("--json", action="store_true", help="a JSON list instead of a table")


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

    p = add("run", setup.cmd_run, "run the daemon")
    p.add_argument("--migrate", action="store_true", help="apply pending migrations first")
    p = add(
        "migrate",
        setup.cmd_migrate,
        "apply database migrations (idempotent); run it as the schema owner, exit 2 otherwise",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="apply a migration that needs every daemon stopped even while some heartbeat",
    )
    p = add(
        "grants", setup.cmd_grants, "print the SQL granting a role what the daemon and CLI need"
    )
    p.add_argument("role", metavar="ROLE", help="the role the daemon and the CLI log in as")
    p.add_argument(
        "--schema", metavar="S", help="the pgtick schema (default: the config's database.schema)"
    )
    p.add_argument(
        "--monitor",
        action="store_true",
        help="also grant pg_monitor, so that `status` and the metrics see every role's sessions "
        "holding the MVCC horizon (a superuser runs that line)",
    )
    p = add("deploy-files", deploy.cmd_deploy_files, "write the unit, config, dashboard, alerts")
    p.add_argument("dir", metavar="DIR", help="where to write them (created if missing)")
    p.add_argument("--force", action="store_true", help="overwrite files that exist")
    p = add("check", setup.cmd_check, "validate config, schedules and handlers")
    p.add_argument("--db", action="store_true", help="also check the database and its schema")
    p = add("enqueue", runs.cmd_enqueue, "add a run; prints its id")
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
    p.add_argument("--max-attempts", type=_max_attempts, metavar="N")
    p.add_argument(
        "--priority",
        type=_priority,
        metavar="N",
        help="higher first among due runs of its type (default: the job type's priority)",
    )
    p.add_argument(
        "--concurrency-key",
        metavar="K",
        help="the run's key for max_running_per_key and rate_per_key (default: the job type's"
        " concurrency_key field of the payload)",
    )
    p.add_argument(
        "--traceparent",
        metavar="TP",
        help="the W3C traceparent of the span the run belongs to, its attempts' parent"
        " (default: $TRACEPARENT, if set)",
    )
    for outcome in ("success", "dead"):
        p.add_argument(
            f"--on-{outcome}",
            metavar="STEP",
            help=f"enqueued when the run {'succeeds' if outcome == 'success' else 'is dead'}"
            ': a job type, or JSON {"job_type": ..., "payload": {...}, "on_success": ...}'
            " or a list of them (docs/composition.md)",
        )
    p.add_argument("--batch", type=_run_id, metavar="BATCH_ID", help="a member of this open batch")
    p = add(
        "status",
        status.cmd_status,
        "workers, queues and schedules on one screen; exit 5 when something needs attention",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p.add_argument(
        "--horizon-threshold",
        metavar="DURATION",
        default="15m",
        help="a snapshot holding the MVCC horizon longer than this needs attention "
        "(default 15m, as the PgtickVacuumBlocked alert)",
    )
    _add_runs(sub, common)
    _add_change(sub, common, operations.RETRY)
    _add_change(sub, common, operations.CANCEL)
    p = add(
        "prune",
        runs.cmd_prune,
        "remove old finished runs and their attempts (whole partitions, then in batches)",
    )
    p.add_argument(
        "--older-than",
        metavar="WHEN",
        help=f"finished before this: {WHEN_HELP} ago (default: the config's [retention])",
    )
    p.add_argument(
        "--status",
        action="append",
        metavar="S",
        help=f"only this status; repeatable ({', '.join(operations.TERMINAL_STATUSES)})",
    )
    p.add_argument("--dry-run", action="store_true", help="count only, delete nothing")
    p = add("show", runs.cmd_show, "one run: its attempts and errors, schedule and effects")
    p.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    p.add_argument("--json", action="store_true", help="one JSON object instead of text")
    p = add("logs", runs.cmd_logs, "what a run printed, per attempt; --follow a running one")
    p.add_argument("run_id", type=_run_id, metavar="RUN_ID")
    p.add_argument(
        "--attempt", type=_positive_int, metavar="N", help="this attempt only (default: all)"
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="show the latest (or --attempt N) attempt's lines as they come, until it ends; "
        "exit 0 if it succeeded, 1 if not",
    )
    p.add_argument("--stream", choices=operations.OUTPUT_STREAMS, help="only this stream")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    _add_schedules(sub, common)
    batches.add_parser(sub, common, _run_id)
    _add_controls(sub, common)
    p = add("demo", setup.cmd_demo, "run the daemon on an embedded PostgreSQL, for a first look")
    p.add_argument(
        "--data-dir", default=setup.DEMO_DATA_DIR, help="where the embedded server lives"
    )
    return parser
