"""The ``status`` verb: workers, queues, schedules and who holds the MVCC horizon on one
screen; exit 5 when something needs attention.
"""

from __future__ import annotations

import argparse

from pgtick import config as config_mod
from pgtick.cli import context, views
from pgtick.cli.exits import EXIT_ATTENTION, EXIT_OK
from pgtick.cli.render import print_json
from pgtick.surfaces import operations


def cmd_status(args: argparse.Namespace) -> int:
    threshold = config_mod.parse_duration(args.horizon_threshold, "--horizon-threshold")
    cfg = context.begin(args)
    st = context.call(
        args,
        cfg,
        lambda store: operations.status(
            store,
            heartbeat_seconds=cfg.worker.heartbeat_seconds,
            tick_interval_seconds=cfg.ticker.interval_seconds,
            horizon_threshold_seconds=threshold,
            limits=operations.flow_limits(cfg),
        ),
    )
    if args.json:
        print_json(views.status_fields(st))
    else:
        views.print_status(st)
    return EXIT_OK if st.healthy else EXIT_ATTENTION
