"""Markdown tables from storage_proto.py's JSON results: the median over the runs given, and the
range (min-max) where more than one run measured it.

    .venv/bin/python docs/design/prototype/summarize.py run1.json run2.json ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def med(values: list[float]) -> str:
    if not values:
        return "-"
    m = statistics.median(values)
    fmt = (lambda v: f"{v:.0f}") if m >= 100 else (lambda v: f"{v:.2g}" if m < 1 else f"{v:.1f}")
    if len(values) > 1:
        return f"{fmt(m)} ({fmt(min(values))}-{fmt(max(values))})"
    return fmt(m)


def ratio(values: list[float], base: list[float]) -> str:
    if not values or not base:
        return "-"
    rs = [v / b for v, b in zip(values, base, strict=False) if b]
    return f"{statistics.median(rs):.1f}x" if rs else "-"


def main(paths: list[str]) -> None:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    names = sorted({k for r in runs for k in r if len(k) == 1})

    def get(name: str, fn: Any) -> list[float]:
        out = []
        for r in runs:
            try:
                v = fn(r[name])
            except (KeyError, IndexError, TypeError, StopIteration):
                continue
            if v is not None:
                out.append(float(v))
        return out

    if any("throughput" in r.get(n, {}) for r in runs for n in names):
        throughput_table(runs, names, get)
    if any("pinned" in r.get(n, {}) for r in runs for n in names):
        pinned_tables(runs, names, get)


def throughput_table(runs: list[Any], names: list[str], get: Any) -> None:
    print("### Unpinned throughput (runs/s, full cycle: enqueue + claim + finish)\n")
    print("| candidate | 1 claimer | 2 claimers | 1 claimer vs A |")
    print("|---|---|---|---|")
    base1 = get("A", lambda c: c["throughput"][0]["runs_per_s"])
    for n in names:
        one = get(n, lambda c: c["throughput"][0]["runs_per_s"])
        two = get(n, lambda c: c["throughput"][1]["runs_per_s"])
        if not one:
            continue
        print(f"| {n} | {med(one)} | {med(two)} | {ratio(one, base1)} |")


def pinned_tables(runs: list[Any], names: list[str], get: Any) -> None:
    def cp(c: dict[str, Any], consumed: Any, key: str) -> Any:
        return next(x for x in c["pinned"]["checkpoints"] if x["consumed"] == consumed).get(key)

    consumed_points: list[Any] = ["unpinned", 0, 25000, 50000, 100000, 200000, 360000]
    for key, title in (
        ("claim_us_per_run_server", "Claim, server time per claimed run (µs), batches of 64"),
        (
            "claim_us_per_run",
            "Claim, client time per claimed run (µs, incl. planning), batches of 64",
        ),
        (
            "claim1_ms",
            "One claim that finds one run (ms, client, incl. planning): the 400 runs/s case",
        ),
        ("succeed_us_per_run_server", "Succeed (finish), server time per run (µs)"),
        ("rescan_ms", "Keyset rescan from -infinity (ms)"),
        ("heartbeat200_ms", "Heartbeat of 200 held leases (ms)"),
        ("reap_ms", "Reaper probe (ms)"),
        ("next_due_ms", "Next-due probe (ms)"),
        ("metrics_ms", "Metrics counts (ms)"),
    ):
        cols = [
            p
            for p in consumed_points
            if any(get(n, lambda c, p=p, key=key: cp(c, p, key)) for n in names)
        ]
        if not cols:
            continue
        print(f"\n### {title}\n")
        heads = ["unpinned" if p == "unpinned" else f"{p // 1000}k" for p in cols]
        print("| candidate | " + " | ".join(heads) + f" | {heads[-1]} / unpinned |")
        print("|---|" + "---|" * (len(cols) + 1))
        for n in names:
            vals = [get(n, lambda c, p=p, key=key: cp(c, p, key)) for p in cols]
            if not any(vals):
                continue
            print(
                f"| {n} | " + " | ".join(med(v) for v in vals) + f" | {ratio(vals[-1], vals[0])} |"
            )

    print("\n### Sizes at the last checkpoint under the pin, and retention (while pinned)\n")
    print(
        "| candidate | total MB | hot table MB | retention µs/run | dead tuples added by it |"
        " MB after retention |"
    )
    print("|---|---|---|---|---|---|")
    for n in names:
        last = get(n, lambda c: c["pinned"]["checkpoints"][-1]["sizes"]["total_mb"])
        hot = get(
            n,
            lambda c: c["pinned"]["checkpoints"][-1]["sizes"]["per_mb"].get(
                "queue", c["pinned"]["checkpoints"][-1]["sizes"]["per_mb"].get("runs")
            ),
        )
        ret = get(
            n,
            lambda c: (
                c["pinned"]["retention"]["us_per_run"]
                if c["pinned"]["retention"]["removed_runs"] > 1000
                else None
            ),
        )
        dead = get(
            n,
            lambda c: (
                c["pinned"]["retention"]["size_after"]["dead_tup"]
                - c["pinned"]["retention"]["size_before"]["dead_tup"]
            ),
        )
        after = get(n, lambda c: c["pinned"]["retention"]["size_after"]["total_mb"])
        print(f"| {n} | {med(last)} | {med(hot)} | {med(ret)} | {med(dead)} | {med(after)} |")


if __name__ == "__main__":
    main(sys.argv[1:])
