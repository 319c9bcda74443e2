"""The ``audit`` verb: who did what, when, to which runs (the audit log, newest first)."""

from __future__ import annotations

import argparse
import json

from pgtick.cli import context
from pgtick.cli.args import parse_since, resolve_when
from pgtick.cli.exits import EXIT_OK
from pgtick.cli.render import cut, iso, print_json, print_table
from pgtick.storage.store import AuditEntry, RunStore
from pgtick.surfaces import operations

COLUMNS = ("AT", "WHO", "VIA", "ROLE", "ACTION", "TARGET", "RUNS", "ARGS")


def _fields(e: AuditEntry) -> dict[str, object]:
    return {
        "id": e.id,
        "at": iso(e.at),
        "actor": e.actor,
        "via": e.via,
        "db_role": e.db_role,
        "action": e.action,
        "target": e.target,
        "args": dict(e.args),
        "runs_affected": e.runs_affected,
        "run_ids": e.run_ids,
    }


def _cells(e: AuditEntry) -> tuple[str, ...]:
    runs = "-" if e.runs_affected is None else str(e.runs_affected)
    if e.run_ids and len(e.run_ids) <= 3:
        runs += f" ({', '.join(str(i) for i in e.run_ids)})"
    return (
        iso(e.at, whole_seconds=True) or "",
        cut(e.actor, 30),
        e.via,
        cut(e.db_role, 16),
        e.action,
        cut(e.target or "-", 24),
        runs,
        cut(json.dumps(dict(e.args), sort_keys=True), 60),
    )


def cmd_audit(args: argparse.Namespace) -> int:
    cfg = context.begin(args)
    since = parse_since(args.since, "--since")

    def read(store: RunStore) -> list[AuditEntry]:
        start = None if since is None else resolve_when(since, store.now(), ahead=False)
        return operations.audit_entries(store, start, args.limit)

    entries = context.call(args, cfg, read)
    if args.json:
        print_json([_fields(e) for e in entries])
    elif not entries:
        print("no actions recorded" + ("" if since is None else " in that time"))
    else:
        print_table(COLUMNS, [_cells(e) for e in entries])
    return EXIT_OK
