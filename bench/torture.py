"""Torture: the guarantees harness (issue 43) for a bounded time, then its checker's verdict.

Daemons (``--daemons``, at most a few on a small machine) run on an embedded PostgreSQL of
their own (the plan restarts it), or on --dsn / $PGTICK_BENCH_DSN / $PGTICK_TEST_DSN (never
restarted), while a plan drawn from ``--seed`` enqueues at each isolation level, races
idempotency keys, cancels, retries, prunes, and injects faults: SIGKILL, SIGTERM, SIGSTOP
past the lease, killed sessions, a server restart, a row held locked past the lease, a held
snapshot. The seed is printed first; the same seed (and --only) replays the same plan. Then
every daemon is stopped and the checker judges the history (docs/guarantees.md): one block
per violation, the counts of what was exercised, exit 1 on any violation. ``--keep DIR``
keeps the history (``python -m tests.torture DIR`` judges it again). The tests' fixed seeds:
tests/torture/test_seeds.py.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

from tests.torture import plan as torture_plan
from tests.torture import run as torture_run

from bench import common

# The part starts (and restarts) a server of its own: bench's shared one cannot be restarted.
OWN_SERVER = True
DEFAULT_MINUTES = 3.0
DEFAULT_DAEMONS = 3
DSN_ENV = "PGTICK_TEST_DSN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, help="the plan's seed (default: a random one, printed)")
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES, help="run time (3)")
    parser.add_argument("--daemons", type=int, default=DEFAULT_DAEMONS, help="daemon processes (3)")
    parser.add_argument(
        "--only",
        default="",
        metavar="KIND,...",
        help="only these operations and faults: " + ", ".join(torture_plan.KINDS),
    )
    parser.add_argument(
        "--faults",
        type=float,
        default=1.0,
        help="every fault's rate times this (1; 3 draws each fault 20 times or more in 30 minutes)",
    )
    parser.add_argument("--keep", type=Path, help="write the history into DIR and keep it")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="each daemon's worker.processes (1); 2 runs every daemon as a supervisor and two "
        "worker processes",
    )


def options(args: argparse.Namespace) -> torture_run.Options:
    seed = args.seed if args.seed is not None else random.randrange(1, 1_000_000)
    only = tuple(k.strip() for k in args.only.split(",") if k.strip())
    return torture_run.Options(
        seed=seed,
        minutes=args.minutes,
        daemons=args.daemons,
        only=only,
        dsn=args.dsn or os.environ.get(common.DSN_ENV) or os.environ.get(DSN_ENV) or None,
        keep=args.keep,
        processes=args.processes,
        faults=args.faults,
    )


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started."""
    chosen = options(args)
    args.seed = chosen.seed  # drawn once: the plan and the record say the same seed
    try:
        torture_plan.draw(chosen.seed, chosen.minutes, chosen.daemons, chosen.only, chosen.faults)
    except torture_plan.PlanError as exc:
        raise common.BenchError(str(exc), 2) from exc


def run(args: argparse.Namespace, admin_dsn: str | None, tmp: Path, record: common.Record) -> None:
    chosen = options(args)
    record.options = {
        "seed": chosen.seed,
        "minutes": chosen.minutes,
        "daemons": chosen.daemons,
        "processes": chosen.processes,
        "faults": chosen.faults,
        "only": list(chosen.only),
    }
    verdict = torture_run.execute(chosen, sys.stdout)
    record.results = {
        "violations": [
            {"invariant": f.invariant, "subject": f.subject, "summary": f.summary}
            for f in verdict.violations
        ],
        "excused": len(verdict.excused),
        "counts": {title: dict(counter) for title, counter in verdict.counts.items()},
    }
    if verdict.violations:
        path = record.write()
        print(f"[torture] results: {path}")
        raise common.BenchError(
            f"seed {chosen.seed}: {len(verdict.violations)} violations (see above)", 1
        )
