"""The verbs on a job type at runtime: ``pause``, ``resume`` and ``limits`` (stored in the
database, for every daemon; docs/operations/runtime.md).
"""

from __future__ import annotations

import argparse
import sys

from pgtick.cli import context
from pgtick.cli.exits import EXIT_OK
from pgtick.cli.render import print_json
from pgtick.errors import UsageError
from pgtick.storage.store import LimitChange, RunStore
from pgtick.surfaces import operations


def cmd_pause(args: argparse.Namespace) -> int:
    actor = operations.cli_actor()
    changed = context.call(
        args,
        context.begin(args),
        lambda store: operations.pause_job_type(store, args.job_type, args.reason, actor),
    )
    if changed:
        print(f"paused {args.job_type}: no daemon claims its runs until `pgtick resume`")
    else:
        print(f"{args.job_type} was paused already")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    actor = operations.cli_actor()
    changed = context.call(
        args,
        context.begin(args),
        lambda store: operations.resume_job_type(store, args.job_type, actor),
    )
    print(f"resumed {args.job_type}" if changed else f"{args.job_type} was not paused")
    return EXIT_OK


def cmd_limits(args: argparse.Namespace) -> int:
    """Change (or reset) a job type's limits, then show those in force with their source."""
    cfg = context.begin(args)
    actor = operations.cli_actor()
    change = LimitChange(args.max_running, args.max_running_per_key, args.rate, args.rate_per_key)
    if args.reset and not change.empty:
        raise UsageError("--reset: give it alone, not with new limits")
    config_types = {t.job_type: t for t in operations.flow_limits(cfg)}

    def run(store: RunStore) -> operations.Limits:
        if args.reset:
            operations.reset_limits(store, args.job_type, actor)
        elif not change.empty:
            operations.set_limits(store, args.job_type, change, actor)
        controls = operations.controls_for(store)
        return operations.limits_in_force(
            args.job_type, config_types.get(args.job_type), controls.get(args.job_type)
        )

    limits = context.call(args, cfg, run)
    if args.json:
        print_json(
            {
                "job_type": limits.job_type,
                "limits": {
                    lim.name: {"value": lim.value, "source": lim.source} for lim in limits.limits
                },
            }
        )
    elif not limits.limits:
        print(f"{args.job_type}: no limits")
    else:
        print(f"{args.job_type}: {operations.describe(limits)}")
    if not args.json and operations.declares_job_type(cfg, args.job_type) is False:
        # The config's limits are each daemon's; this command knows those of its own file.
        print(
            f"note: {context.config_source(cfg)} does not declare {args.job_type}: its "
            "limits from the daemons' configs are not shown (--config)",
            file=sys.stderr,
        )
    return EXIT_OK
