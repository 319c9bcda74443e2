"""Sustained load: --rate runs a second for --duration seconds (or --minutes) into one daemon
whose succeeded runs are kept only --retention (``[retention] succeeded``), so the tables should
reach a steady size.

The daemon (defaults otherwise, role pgtick_bench_worker) runs the ``ledger`` handler, which
appends each run's id to a file: retention deletes succeeded runs with their attempts, so that
file is what shows at the end how often each run was executed. The producer enqueues through
``pgtick.enqueue`` in small batches every 10 ms and keeps every id it got back.

Every --sample seconds: the total size of pgtick's tables (pg_total_relation_size: table,
indexes, TOAST), their live and dead tuples, deleted tuples (n_tup_del) since the last sample,
the daemon's ``runs_pruned`` log lines, the claim statement's calls, mean, max (pg_stat_statements,
max reset every sample on PostgreSQL 17+) and time per claimed run, the claim's p99 round trip in
the interval from the daemon's own histogram (pgtick_claim_duration_seconds, scraped each
sample), and pickup p50/p99 of runs claimed in the interval (started_at - created_at, database
clock); and every statement of the daemon's role, by the queries.sql block it comes from
(bench/statements.py): calls, time, rows and shared buffers in the interval. At the end, each
statement's time per call and per claimed run in the reference interval (the first one that
starts a minute in: minute 2 at the default --sample; the first minute starts from empty tables)
against the last, with the ratios.

Bars: size at the middle sample (minute 5 of 10) and the last within 10 %; the claim's mean (the
server's) and p99 (the daemon's) flat (the later half of the samples' median at most 1.5x the
earlier half's); the per-interval max, one claim in some 17 000, is reported; every run
succeeded exactly once (each enqueued id in the ledger once, what is left in ``runs`` succeeded
with one attempt, pgtick_run_attempts_total{outcome="succeeded"} equal to the runs enqueued and
no other outcome); retention deleted no rows (n_tup_del of the tables that hold runs, attempts
and output, but for the rows a finish moves out of runs_live, which PostgreSQL counts as
deleted there: 0 when retention drops whole partitions); every statement's time per claimed run
in the last interval under 2x the reference's (the statements with at least 10 calls in both).
The daemon prunes every eighth of the retention (every 15 s at 2 minutes; at least every 10 s,
at most every 5 minutes), its first prune that long after it starts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import common, load, statements

DEFAULT_RATE = 1000.0
DEFAULT_DURATION_SECONDS = 600.0
DEFAULT_RETENTION = "2m"
DEFAULT_SAMPLE_SECONDS = 60.0
SIZE_TOLERANCE = 0.10
# Each statement's time per claimed run, last interval against the reference one.
STATEMENT_BAR_RATIO = 2.0
# The reference interval is the first starting this long after the load began.
REFERENCE_AFTER_SECONDS = 60.0
# The daemon prunes every eighth of its shortest retention, within these bounds, the first
# time that long after it starts (docs/concepts.md, the reaper); a shorter soak sees none.
DAEMON_PRUNE_MIN_SECONDS = 10.0
DAEMON_PRUNE_MAX_SECONDS = 300.0
DAEMON_PRUNES_PER_RETENTION = 8
SETTLE_SECONDS = 3.0
DRAIN_TIMEOUT_SECONDS = 120.0
RESULTS_SECONDS = 15.0  # for the results of runs the ledger says ran (final_checks)
CLAIM_HISTOGRAM = "pgtick_claim_duration_seconds"
OUTCOMES_OTHER_THAN_SUCCESS = ("failed", "lost", "released", "cancelled")
PICKUPS = """
SELECT extract(epoch FROM started_at - created_at) * 1000 FROM pgtick.runs
WHERE started_at >= %s AND started_at < %s
"""
REMAINING = """
SELECT r.status, count(*), count(*) FILTER (WHERE r.attempts = 1 AND a.n = 1 AND a.ok = 1)
FROM pgtick.runs r
LEFT JOIN (SELECT run_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'succeeded') AS ok
           FROM pgtick.attempts GROUP BY run_id) a ON a.run_id = r.id
GROUP BY r.status
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="runs/s (1000)")
    parser.add_argument("--duration", type=float, default=None, help="seconds of load (600)")
    parser.add_argument("--minutes", type=float, help="minutes of load (instead of --duration)")
    parser.add_argument(
        "--retention",
        default=DEFAULT_RETENTION,
        help="retention.succeeded of the daemon, a pgtick duration (2m)",
    )
    parser.add_argument(
        "--sample", type=float, default=DEFAULT_SAMPLE_SECONDS, help="seconds between samples (60)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    common.add_settings_option(parser)
    load.add_setup_sql_option(parser)


def duration_seconds(text: str) -> float:
    """A pgtick duration ("90s", "2m", "1h30m", or bare seconds) in seconds."""
    return common.duration_seconds(text, "--retention")


def daemon_prune_every(args: argparse.Namespace) -> float:
    """How often the soak's daemon prunes (its other retentions are days: the succeeded one
    is the shortest)."""
    every = duration_seconds(args.retention) / DAEMON_PRUNES_PER_RETENTION
    return min(DAEMON_PRUNE_MAX_SECONDS, max(DAEMON_PRUNE_MIN_SECONDS, every))


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started (and --minutes made --duration)."""
    if args.minutes is not None and args.duration is not None:
        raise common.BenchError("--duration or --minutes, not both", 2)
    if args.minutes is not None:
        args.duration = args.minutes * 60
    elif args.duration is None:
        args.duration = DEFAULT_DURATION_SECONDS
    if args.rate <= 0 or args.duration <= 0 or args.sample <= 0:
        raise common.BenchError("--rate, --duration and --sample must be positive", 2)
    if args.sample > args.duration:
        raise common.BenchError("--sample must not exceed --duration", 2)
    if args.sample >= duration_seconds(args.retention):
        # The pickups of an interval are read from runs at its end: none may be pruned yet.
        raise common.BenchError("--sample must be shorter than --retention", 2)
    load.check_settings(args.set)
    load.check_setup_sql(args)


def sample_offsets(duration: float, sample: float) -> list[float]:
    """Sample instants (seconds since the producer started): every ``sample``, and the end."""
    count = int(duration // sample + 1e-9)
    offsets = [sample * (i + 1) for i in range(count)]
    if not offsets or duration - offsets[-1] > 1e-6:
        offsets.append(duration)
    return offsets


def size_bar(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Total size at the sample nearest the middle of the soak against the last sample."""
    end = samples[-1]
    middle = min(samples[:-1] or samples, key=lambda s: abs(s["t_s"] - end["t_s"] / 2))
    change = load.ratio(end["bytes"], middle["bytes"])
    growth = None if change is None else change - 1
    return {
        "middle_t_s": middle["t_s"],
        "end_t_s": end["t_s"],
        "middle_bytes": middle["bytes"],
        "end_bytes": end["bytes"],
        "change": growth,
        "ok": None if growth is None else abs(growth) <= SIZE_TOLERANCE,
    }


# Where a finish moves a run's row from: PostgreSQL counts the move as a delete there (and
# an insert in the partition of the run's status); every other table of pgtick's only ever
# loses rows to retention (or to nothing).
MOVED_FROM = ("runs_live",)


def retained(table: str) -> bool:
    """Whether ``table``'s deleted tuples are retention's (see MOVED_FROM)."""
    return table not in MOVED_FROM and table.startswith(("runs", "attempts", "output_chunks"))


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def pruned_total(daemon: common.Daemon) -> int:
    return sum(int(e.get("count", 0)) for e in daemon.events("runs_pruned"))


def take_sample(
    t: float,
    previous: dict[str, Any] | None,
    conn: psycopg.Connection[Any],
    admin: psycopg.Connection[Any],
    dbname: str,
    role: str,
    daemon: common.Daemon,
    claim: Any,
) -> dict[str, Any]:
    """Everything recorded at one sample instant, and the interval since the previous one."""
    at = load.db_now(conn)
    tabs = load.tables(conn, "pgtick")
    stmts = load.statements(admin, dbname, role)
    claim_ids = [qid for qid, s in stmts.items() if claim.search(s.query)]
    max_ms = max((stmts[q].max_ms for q in claim_ids), default=None)
    per_interval_max = load.reset_max(admin, claim_ids)
    sample: dict[str, Any] = {
        "t_s": t,
        "at": at,
        "bytes": sum(x.bytes for x in tabs),
        "live": sum(x.live for x in tabs),
        "dead": sum(x.dead for x in tabs),
        "deleted_total": sum(x.deleted for x in tabs),
        "retention_deleted_total": sum(x.deleted for x in tabs if retained(x.name)),
        "pruned_total": pruned_total(daemon),
        "tables": [x.__dict__ for x in tabs],
        "_statements": stmts,
        "_claim_buckets": load.buckets(load.metrics_url(daemon), CLAIM_HISTOGRAM),
        "max_is_per_interval": per_interval_max,
    }
    if previous is None:
        return sample
    delta = load.combined(load.statement_deltas(previous["_statements"], stmts), claim)
    sample.update(
        interval_s=t - previous["t_s"],
        deleted=sample["deleted_total"] - previous["deleted_total"],
        retention_deleted=sample["retention_deleted_total"] - previous["retention_deleted_total"],
        pruned=sample["pruned_total"] - previous["pruned_total"],
        claim_calls=delta.calls,
        claim_mean_ms=delta.mean_ms,
        claim_max_ms=max_ms if previous.get("max_is_per_interval") else None,
        claim_max_since_start_ms=max_ms,
        claim_per_run_us=delta.per_row_us,
        claim_p99_ms=ms(load.quantile(0.99, sample["_claim_buckets"], previous["_claim_buckets"])),
        statements=statements.window_figures(load.statement_deltas(previous["_statements"], stmts)),
        pickup_ms=common.distribution(
            [float(r[0]) for r in conn.execute(PICKUPS, [previous["at"], at])]
        ),
    )
    return sample


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    settings = load.check_settings(args.set)
    record.options = {
        "rate": args.rate,
        "duration": args.duration,
        "retention": args.retention,
        "sample": args.sample,
        "set": args.set,
        "setup_sql": str(args.setup_sql) if args.setup_sql else None,
    }
    ledger = tmp / "soak-ledger.txt"
    claim = load.CLAIM
    with (
        load.statements_server(admin_dsn, restartable=not load.external(args)),
        load.worker_role(admin_dsn) as role,
        load.database(admin_dsn, "soak", pgtick_schema=True, setup_sql=args.setup_sql) as dsn,
    ):
        config = load.daemon_config(
            tmp / "soak.toml", settings=settings, retention={"succeeded": args.retention}
        )
        with load.environ(**{load.LEDGER_ENV: str(ledger)}):
            daemon = common.start_daemon(load.as_role(dsn, role), config, tmp / "soak-daemon.log")
        try:
            result = soak(args, admin_dsn, dsn, role, daemon, ledger, claim)
            code = daemon.stop()
            if code != 0:
                raise common.BenchError(f"daemon exit code {code} after SIGTERM")
        finally:
            daemon.kill()
    record.results = result
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if not result["checks"]["ok"]:
        raise common.BenchError("not every run succeeded exactly once (see the checks above)")


def soak(
    args: argparse.Namespace,
    admin_dsn: str,
    dsn: str,
    role: str,
    daemon: common.Daemon,
    ledger: Path,
    claim: Any,
) -> dict[str, Any]:
    dbname = common.database_name(dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as admin, common.connect(dsn) as conn:
        time.sleep(SETTLE_SECONDS)
        producer = load.Producer(lambda: load.pgtick_enqueuer(dsn, "ledger"), args.rate)
        samples: list[dict[str, Any]] = []
        try:
            first = take_sample(0.0, None, conn, admin, dbname, role, daemon, claim)
            producer.start()
            started = time.monotonic()
            previous = first
            for offset in sample_offsets(args.duration, args.sample):
                load.wait_until(started + offset, producer.check, daemon.check_alive)
                previous = take_sample(offset, previous, conn, admin, dbname, role, daemon, claim)
                samples.append(previous)
                print(f"  {progress(previous)}", flush=True)
            producer.finish()
            producer.check()
            ids = list(producer.ids)

            def all_executed() -> bool:
                daemon.check_alive()
                return len(load.ledger_counts(ledger)) >= len(set(ids))

            common.wait_for(all_executed, DRAIN_TIMEOUT_SECONDS, f"{len(ids)} runs to finish")
            # A handler writes the ledger before its result is committed and counted: the
            # last results may still be on their way (a loaded machine: tens of ms or more).
            checks = final_checks(conn, daemon, ids, ledger)
            written_by = time.monotonic() + RESULTS_SECONDS
            while not checks["ok"] and time.monotonic() < written_by:
                time.sleep(0.2)
                checks = final_checks(conn, daemon, ids, ledger)
        finally:
            producer.finish()
    for s in [first, *samples]:
        s.pop("_statements", None)
        s.pop("_claim_buckets", None)
    prune_every = daemon_prune_every(args)
    reference = reference_sample(samples)
    compared = statements.compare(
        reference["statements"],
        samples[-1]["statements"],
        STATEMENT_BAR_RATIO,
        statements.DEFAULT_MIN_CALLS,
    )
    return {
        "rate": args.rate,
        "achieved_rate": round(producer.achieved_rate(), 1),
        "producer_max_lag_runs": producer.max_lag,
        "retention": args.retention,
        "start": first,
        "samples": samples,
        "size": size_bar(samples),
        "claim_mean_growth": load.growth([s["claim_mean_ms"] for s in samples]),
        "claim_max_growth": load.growth([s["claim_max_ms"] for s in samples]),
        "claim_p99_growth": load.growth([s["claim_p99_ms"] for s in samples]),
        "claim_mean_flat": load.flat([s["claim_mean_ms"] for s in samples]),
        "claim_p99_flat": load.flat([s["claim_p99_ms"] for s in samples]),
        "pickup_p99_growth": load.growth([s["pickup_ms"].get("p99") for s in samples]),
        "retention_deletes": samples[-1]["retention_deleted_total"]
        - first["retention_deleted_total"],
        "moves_out_of_live": samples[-1]["deleted_total"]
        - first["deleted_total"]
        - (samples[-1]["retention_deleted_total"] - first["retention_deleted_total"]),
        "pruned": samples[-1]["pruned_total"] - first["pruned_total"],
        "prune_every": prune_every,
        "prune_expected": args.duration >= prune_every,
        "checks": checks,
        "statements": {
            "first": interval_label(reference),
            "last": interval_label(samples[-1]),
            "rows": compared,
            **statements.verdict(compared),
        },
    }


def reference_sample(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The interval the statements' last one is compared with: the first that starts a
    minute in (or later), unless that is the last, then the first."""
    for previous, sample in itertools.pairwise(samples[:-1]):
        if previous["t_s"] >= REFERENCE_AFTER_SECONDS - 1e-6:
            return sample
    return samples[0]


def interval_label(sample: dict[str, Any]) -> str:
    return f"{sample['t_s'] - sample['interval_s']:.0f}-{sample['t_s']:.0f}s"


def final_checks(
    conn: psycopg.Connection[Any], daemon: common.Daemon, ids: list[int], ledger: Path
) -> dict[str, Any]:
    """Every run succeeded exactly once, from three sources that retention cannot erase."""
    once = load.exactly_once(ids, load.ledger_counts(ledger))
    remaining = {status: (n, good) for status, n, good in conn.execute(REMAINING)}
    attempts = load.scrape(load.metrics_url(daemon), "pgtick_run_attempts_total")
    by_outcome: dict[str, float] = {}
    for labels, value in attempts.items():
        outcome = dict(labels).get("outcome", "")
        by_outcome[outcome] = by_outcome.get(outcome, 0.0) + value
    ledger_ok = once["missing"] == once["repeated"] == once["unknown"] == 0
    remaining_ok = set(remaining) <= {"succeeded"} and all(
        n == good for n, good in remaining.values()
    )
    metrics_ok = by_outcome.get("succeeded") == len(ids) and not any(
        by_outcome.get(o) for o in OUTCOMES_OTHER_THAN_SUCCESS
    )
    return {
        "ok": ledger_ok and remaining_ok and metrics_ok,
        "ledger": once,
        "ledger_ok": ledger_ok,
        "runs_left_by_status": {s: n for s, (n, _) in remaining.items()},
        "runs_left_with_one_succeeded_attempt": sum(good for _, good in remaining.values()),
        "runs_left_ok": remaining_ok,
        "attempts_metric_by_outcome": by_outcome,
        "metrics_ok": metrics_ok,
    }


def progress(s: dict[str, Any]) -> str:
    p = s.get("pickup_ms", {})
    return (
        f"{s['t_s']:.0f} s: {load.mib(s['bytes']):,.1f} MiB, {s['dead']:,} dead, "
        f"{s.get('deleted', 0):,} deleted, claim mean {load.fmt(s.get('claim_mean_ms'), 3)} ms, "
        f"pickup p99 {load.fmt(p.get('p99'))} ms"
    )


def report(result: dict[str, Any]) -> None:
    rows = []
    for s in result["samples"]:
        p = s["pickup_ms"]
        rows.append(
            [
                round(s["t_s"]),
                load.fmt(load.mib(s["bytes"]), 1),
                s["live"],
                s["dead"],
                s["deleted"],
                s["pruned"],
                s["claim_calls"],
                load.fmt(s["claim_mean_ms"], 3),
                load.fmt(s["claim_p99_ms"], 2),
                load.fmt(s["claim_max_ms"], 2),
                load.fmt(s["claim_per_run_us"], 1),
                load.fmt(p.get("p50")),
                load.fmt(p.get("p99")),
            ]
        )
    print(
        f"\n{result['rate']:.0f} runs/s asked, {result['achieved_rate']:.0f} enqueued/s "
        f"(max lag {result['producer_max_lag_runs']} runs), retention.succeeded = "
        f"{result['retention']}"
    )
    print(
        common.table(
            [
                "t s",
                "MiB",
                "live",
                "dead",
                "deleted",
                "pruned",
                "claims",
                "claim mean ms",
                "claim p99 ms",
                "claim max ms",
                "claim us/run",
                "pickup p50",
                "pickup p99",
            ],
            rows,
        )
    )
    size, checks, st = result["size"], result["checks"], result["statements"]
    print()
    print(statements.table(st["rows"], st["first"], st["last"]))
    bars = [
        [
            f"size at {size['middle_t_s']:.0f} s vs {size['end_t_s']:.0f} s within 10 %",
            f"{load.mib(size['middle_bytes']):,.1f} -> {load.mib(size['end_bytes']):,.1f} MiB",
            load.fmt(None if size["change"] is None else size["change"] * 100, 1, " %"),
            load.verdict(size["ok"]),
        ],
        [
            "claim mean flat",
            "later / earlier half of the samples",
            load.fmt(result["claim_mean_growth"], 2, "x"),
            load.verdict(result["claim_mean_flat"]),
        ],
        [
            "claim p99 flat (the daemon's histogram)",
            "later / earlier half of the samples",
            load.fmt(result["claim_p99_growth"], 2, "x"),
            load.verdict(result["claim_p99_flat"]),
        ],
        [
            "claim max (information)",
            "later / earlier half of the samples",
            load.fmt(result["claim_max_growth"], 2, "x"),
            "",
        ],
        [
            "pickup p99 (information)",
            "later / earlier half of the samples",
            load.fmt(result["pickup_p99_growth"], 2, "x"),
            "",
        ],
        [
            "every run succeeded exactly once",
            f"{checks['ledger']['enqueued']:,} runs; ledger missing {checks['ledger']['missing']}, "
            f"repeated {checks['ledger']['repeated']}",
            "",
            load.verdict(checks["ok"]),
        ],
        [
            "retention deleted no rows (n_tup_del)",
            f"{result['retention_deletes']:,} rows deleted, {result['pruned']:,} runs pruned "
            f"(and {result['moves_out_of_live']:,} rows moved out of runs_live)",
            "",
            load.verdict(result["retention_deletes"] == 0 if result["prune_expected"] else None),
        ],
        [
            f"every statement's time per claimed run < {STATEMENT_BAR_RATIO:.0f}x",
            f"{st['last']} against {st['first']}, {st['judged']} judged "
            f"(>= {statements.DEFAULT_MIN_CALLS} calls in both)",
            load.fmt(st["worst_per_run_ratio"], 1, "x"),
            load.verdict(st["ok"]),
        ],
    ]
    print()
    print(common.table(["bar", "figures", "change", "verdict"], bars))
    if not result["prune_expected"]:
        print(
            f"(no verdict on retention: the daemon first prunes {result['prune_every']:.0f} s "
            "after it starts, so a shorter soak never reaches it)"
        )
