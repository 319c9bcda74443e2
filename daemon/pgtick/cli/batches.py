"""The ``batch`` verbs (docs/composition.md, Batches): ``pgtick batch ID`` shows one;
``create FILE``, ``add ID FILE`` and ``close ID`` make them from JSON-lines files."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pgtick.cli import context
from pgtick.cli.exits import EXIT_OK
from pgtick.cli.render import iso, print_json
from pgtick.errors import UsageError
from pgtick.storage.store import Batch, NewRun
from pgtick.surfaces import operations

VERBS = ("show", "create", "add", "close")


def shorthand(argv: Sequence[str]) -> list[str]:
    """``pgtick batch ID ...`` means ``pgtick batch show ID ...``."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "batch":
            if i + 1 < len(args) and args[i + 1].isdigit():
                args.insert(i + 1, "show")
            break
        if not arg.startswith("-"):
            break
    return args


def _members(path: str) -> list[NewRun]:
    if path == "-":
        return operations.members_from_lines(sys.stdin, "stdin")
    try:
        with open(path, encoding="utf-8") as f:
            return operations.members_from_lines(f, path)
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None


def _callback(text: str | None) -> list[dict[str, Any]] | None:
    """--callback: a job type name, or JSON (a step object or a list of them)."""
    if text is None:
        return None
    value: Any = text
    if text.lstrip().startswith(("{", "[")):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"--callback: invalid JSON: {exc}") from None
    return operations.callback_steps(value)


def cmd_batch_create(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    callback = _callback(args.callback)
    runs = _members(args.file)
    batch_id, ids, state = context.call(
        args, cfg, lambda s: operations.create_batch(s, runs, callback, close=not args.open)
    )
    if args.json:
        print_json({"batch_id": batch_id, "run_ids": ids, "state": state})
    else:
        print(batch_id)
    return EXIT_OK


def cmd_batch_add(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    runs = _members(args.file)
    ids = context.call(args, cfg, lambda s: operations.add_members(s, args.batch_id, runs))
    print(f"added {len(ids)} members to batch {args.batch_id}")
    return EXIT_OK


def cmd_batch_close(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    state = context.call(args, cfg, lambda s: operations.close_batch(s, args.batch_id))
    print(f"batch {args.batch_id}: {state}")
    return EXIT_OK


def batch_fields(b: Batch) -> dict[str, Any]:
    return {
        "id": b.id,
        "state": b.state,
        "members": b.members,
        "ended": b.ended,
        "succeeded": b.succeeded,
        "dead": b.dead,
        "cancelled": b.cancelled,
        "skipped": b.skipped,
        "callback": b.callback,
        "callback_run_id": b.callback_run_id,
        "created_at": iso(b.created_at),
        "closed_at": iso(b.closed_at),
        "done_at": iso(b.done_at),
        "members_kept": dict(b.kept),
    }


def cmd_batch_show(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    b = context.call(args, cfg, lambda s: operations.show_batch(s, args.batch_id))
    if args.json:
        print_json(batch_fields(b))
        return EXIT_OK
    print(f"batch {b.id}: {b.state}, {b.ended} of {b.members} members ended")
    print(f"  succeeded {b.succeeded}, dead {b.dead}, cancelled {b.cancelled}, skipped {b.skipped}")
    callbacks = ", ".join(step["job_type"] for step in b.callback or []) or "none"
    print(f"  callback:        {callbacks}")
    if b.callback_run_id is not None:
        print(f"  callback run:    {b.callback_run_id} (pgtick show {b.callback_run_id})")
    for label, value in (("created", b.created_at), ("closed", b.closed_at), ("done", b.done_at)):
        if value is not None:
            print(f"  {label + ':':<17}{iso(value)}")
    kept = ", ".join(f"{status} {n}" for status, n in sorted(b.kept.items())) or "none"
    print(f"  members kept:    {kept} (retention drops finished ones; the counts stay)")
    return EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser, batch_id: Any) -> None:
    """``batch``: its verbs; ``pgtick batch ID`` is ``batch show ID`` (``shorthand``)."""
    text = "batches of runs with a callback once all have ended (verbs: show, create, add, close)"
    p = sub.add_parser("batch", parents=[common], help=text, description=text)
    verbs = p.add_subparsers(dest="action", metavar="VERB", required=True)

    def verb(name: str, fn: Any, help: str) -> Any:
        v = verbs.add_parser(name, parents=[common], help=help, description=help)
        v.set_defaults(func=fn)
        return v

    v = verb("show", cmd_batch_show, "a batch: its state, counts by outcome, callback")
    v.add_argument("batch_id", type=batch_id, metavar="BATCH_ID")
    v.add_argument("--json", action="store_true", help="one JSON object instead of text")
    v = verb("create", cmd_batch_create, "a batch of the runs of a JSON-lines file; prints its id")
    v.add_argument(
        "file",
        metavar="FILE",
        help='one run per line: {"job_type": ..., "payload": {...}, "key": ..., ...}; - is stdin',
    )
    v.add_argument(
        "--callback",
        metavar="STEP",
        help='enqueued once every member has ended: a job type, or JSON {"job_type": ...,'
        ' "payload": {...}}; its payload["batch"] has the id and the counts',
    )
    v.add_argument(
        "--open", action="store_true", help="leave it open for `pgtick batch add` (then close)"
    )
    v.add_argument("--json", action="store_true", help="the batch id and run ids as JSON")
    v = verb("add", cmd_batch_add, "add the runs of a JSON-lines file to an open batch")
    v.add_argument("batch_id", type=batch_id, metavar="BATCH_ID")
    v.add_argument("file", metavar="FILE", help="as for create; - is stdin")
    v = verb("close", cmd_batch_close, "no more members: the callback comes once all have ended")
    v.add_argument("batch_id", type=batch_id, metavar="BATCH_ID")
