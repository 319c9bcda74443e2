"""``python -m bench <part> [options]``: run one benchmark part on a throwaway PostgreSQL
(embedded, or --server N: the distribution's PostgreSQL N), or on $PGTICK_BENCH_DSN / --dsn,
print its table, write bench/results/<part>-<date>.json.

Exit codes: 0 ok, 1 a part failed (a check, a daemon, a peer), 2 usage or a missing package,
3 database unreachable.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import psycopg
import structlog

from bench import common
from pgtick.errors import PgtickError

# part name -> module in this package; `all` runs them in this order at their defaults.
PARTS = {
    "throughput": "throughput",
    "peers": "peers",
    "latency": "latency",
    "precision": "precision",
    "scale": "scale",
    "recovery": "recovery",
    "idle": "idle",
    "scrape": "scrape",
    "console": "console",
    "queue-health": "queue_health",
    "soak": "soak",
    "output": "output",
    "upgrade": "upgrade",
    "torture": "torture",
    "cpu": "cpu",
}


def load(part: str) -> ModuleType:
    return importlib.import_module(f"bench.{PARTS[part]}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parts = parser.add_subparsers(dest="part", required=True, metavar="PART")
    for part in PARTS:
        module = load(part)
        sub = parts.add_parser(
            part,
            help=(module.__doc__ or "").split("\n")[0],
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        common.add_server_options(sub)
        module.add_arguments(sub)
    return parser


def run_part(args: argparse.Namespace) -> None:
    module = load(args.part)
    common.check_server_option(args)
    if hasattr(module, "check"):
        module.check(args)
    tmp = Path(tempfile.mkdtemp(prefix=f"pgtick-bench-{args.part}-"))
    try:
        if getattr(module, "OWN_SERVER", False):
            # The part starts (and may restart) a server of its own, and prints its first
            # line itself (torture: the seed).
            record = common.Record(args.part)
            module.run(args, args.dsn, tmp, record)
            path = record.write()
        else:
            with common.server(common.given_dsn(args), args.server) as admin_dsn:
                record = common.Record(args.part, postgres=common.server_version(admin_dsn))
                print(common.header(args.part, record.postgres), flush=True)
                module.run(args, admin_dsn, tmp, record)
                path = record.write()
        print(f"[{args.part}] results: {path}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # pgtick's own lines (migrations applied) would interleave with the tables.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        run_part(args)
    except common.BenchError as exc:
        print(f"bench {args.part}: {exc}", file=sys.stderr)
        return exc.code
    except psycopg.OperationalError as exc:
        print(f"bench {args.part}: database unreachable: {first_line(exc)}", file=sys.stderr)
        return 3
    except (psycopg.Error, PgtickError) as exc:
        print(f"bench {args.part}: {type(exc).__name__}: {first_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bench {args.part}: interrupted", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
