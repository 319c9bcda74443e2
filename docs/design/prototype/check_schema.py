"""Load proposed_schema.sql into a throwaway PostgreSQL and walk runs through every function once,
checking what the design note promises: claim order (priority, aging), the claim token, retry
and dead paths, release, cancel of a running run (not claimable until let go), the reaper with
leases per worker, orphans, rotation carrying live rows, flow-control limits, the views.

    .venv/bin/python docs/design/prototype/check_schema.py [--pg-bin DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from storage_proto import PG15_BIN, connect, start_server, with_db  # noqa: E402

HERE = Path(__file__).resolve().parent


def check(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        raise SystemExit(1)


def claim(
    conn: psycopg.Connection[Any],
    worker: str,
    types: list[str],
    limit: int,
    lbs: dict[tuple[str, int], Any] | None = None,
) -> list[tuple[Any, ...]]:
    lbs = lbs or {}
    return conn.execute(
        "SELECT id, attempts, priority, job_type FROM pgtick.claim(%s::text, %s::text[],"
        " %s::real[], %s::int[], %s::int, %s::text[], %s::int[], %s::timestamptz[])",
        (
            worker,
            types,
            [60.0] * len(types),
            [3] * len(types),
            limit,
            [k[0] for k in lbs],
            [k[1] for k in lbs],
            list(lbs.values()),
        ),
    ).fetchall()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg-bin", default=str(PG15_BIN))
    args = ap.parse_args()
    with start_server(Path(args.pg_bin)) as server:
        print(f"PostgreSQL {server.version}")
        with connect(server.dsn) as admin:
            admin.execute("CREATE DATABASE schema_check")
        dsn = with_db(server.dsn, "schema_check")
        with connect(dsn) as c:
            c.execute((HERE / "proposed_schema.sql").read_text())
            made = c.execute("SELECT pgtick.ensure_partitions(current_date - 1, 3)").fetchone()
            check(made is not None and made[0] == 27, f"ensure_partitions made {made}")
            again = c.execute("SELECT pgtick.ensure_partitions(current_date - 1, 3)").fetchone()
            check(again is not None and again[0] == 0, "ensure_partitions is idempotent")
            c.execute("INSERT INTO pgtick.workers (id) VALUES ('w1'), ('w2')")

            # Enqueue: priorities, an idempotency key twice, a direct INSERT INTO runs.
            ids = [
                c.execute(
                    "SELECT pgtick.enqueue('t', '{}', now() - interval '1 s', NULL, NULL, %s)", (p,)
                ).fetchone()[0]  # type: ignore[index]
                for p in (0, 0, 5, 0, 0, 0)
            ]
            k1 = c.execute("SELECT pgtick.enqueue('t', '{}', NULL, 'key-1')").fetchone()[0]  # type: ignore[index]
            k2 = c.execute("SELECT pgtick.enqueue('t', '{}', NULL, 'key-1')").fetchone()[0]  # type: ignore[index]
            check(k1 == k2, "the same idempotency key returns the same run")
            old = c.execute(
                "SELECT pgtick.enqueue('t', '{}', now() - interval '1 hour')"
            ).fetchone()[0]  # type: ignore[index]
            c.execute("INSERT INTO pgtick.runs (job_type, payload) VALUES ('other', '{}')")
            check(
                c.execute("SELECT count(*) FROM pgtick.runs WHERE job_type = 'other'").fetchone()[0]
                == 1,
                "INSERT INTO runs goes through enqueue",
            )  # type: ignore[index]

            # Claim: the aged run first (due > 5 min), then priority 5, then oldest due.
            got = claim(c, "w1", ["t"], 3)
            check(
                [r[0] for r in got] == [old, ids[2], ids[0]],  # returned in start order
                f"claim order aged, priority, oldest: {[r[0] for r in got]}",
            )
            held = {r[0]: r[1] for r in got}
            # The claim token: a result for another attempt number is refused.
            bad = c.execute(
                "SELECT * FROM pgtick.succeed('w1', %s, %s)", ([ids[0]], [held[ids[0]] + 1])
            ).fetchall()
            check(bad == [], "succeed with a stale claim token writes nothing")
            # Heartbeat with one held run missing from the list: it is an orphan.
            hb = c.execute(
                "SELECT * FROM pgtick.heartbeat('w1', %s, interval '0')", ([old, ids[2]],)
            ).fetchone()
            assert hb is not None
            check(
                sorted(hb[0]) == sorted([old, ids[2]]) and hb[1] and hb[3] == [ids[0]],
                f"heartbeat: held {hb[0]}, orphans {hb[3]}",
            )
            ok = c.execute(
                "SELECT * FROM pgtick.succeed('w1', %s, %s)", ([old], [held[old]])
            ).fetchall()
            check(ok == [(old,)], "succeed moves the run to history")
            row = c.execute(
                "SELECT status, finished_at IS NOT NULL FROM pgtick.runs WHERE id = %s", (old,)
            ).fetchone()
            check(row == ("succeeded", True), f"runs view shows it succeeded: {row}")
            att = c.execute(
                "SELECT attempt, worker_id, outcome FROM pgtick.attempts WHERE run_id = %s", (old,)
            ).fetchall()
            check(att == [(1, "w1", "succeeded")], f"its one attempt, from the history row: {att}")
            # Fail: a retry stays queued (attempt row written), a final failure goes dead.
            f = c.execute(
                "SELECT * FROM pgtick.fail('w1', %s, %s, %s, %s, %s, %s)",
                (
                    [ids[2], ids[0]],
                    [1, 1],
                    ["boom", "bang"],
                    ["E", "E"],
                    ["tb1", "tb2"],
                    [30.0, None],
                ),
            ).fetchall()
            st = {r[0]: r[1] for r in f}
            check(st == {ids[2]: "failed", ids[0]: "dead"}, f"fail: {st}")
            att = c.execute(
                "SELECT outcome, error FROM pgtick.attempts WHERE run_id = %s", (ids[2],)
            ).fetchall()
            check(att == [("failed", "tb1")], f"the retried attempt's row: {att}")

            # Cancel a running run: not claimable, still held, until the holder lets go.
            got = claim(c, "w2", ["t"], 1)
            victim = got[0][0]
            check(
                c.execute("SELECT * FROM pgtick.cancel(%s)", ([victim],)).fetchall() == [(victim,)],
                "cancel of a running run",
            )
            again = claim(c, "w1", ["t"], 10)
            check(victim not in [r[0] for r in again], "a cancelled, held run is not claimable")
            hb = c.execute(
                "SELECT * FROM pgtick.heartbeat('w2', %s, interval '1 hour')", ([victim],)
            ).fetchone()
            check(
                hb is not None and hb[2] == [victim], "the holder's heartbeat reports it cancelled"
            )
            c.execute("SELECT pgtick.abandon('w2', %s)", ([victim],))
            row = c.execute("SELECT status FROM pgtick.runs WHERE id = %s", (victim,)).fetchone()
            check(row == ("cancelled",), f"let go: cancelled in history {row}")

            # Release: back to queued, attempt not counted.
            rel = [r[0] for r in again][:1]
            c.execute("SELECT pgtick.release('w1', %s)", (rel,))
            row = c.execute(
                "SELECT status, attempts FROM pgtick.runs WHERE id = %s", (rel[0],)
            ).fetchone()
            check(row == ("queued", 0), f"released: {row}")

            # The reaper: w1 stops heartbeating; its runs are reaped.
            c.execute(
                "UPDATE pgtick.workers SET heartbeat_at = now() - interval '10 minutes'"
                " WHERE id = 'w1'"
            )
            c.execute(
                "UPDATE pgtick.queue SET started_at = now() - interval '10 minutes'"
                " WHERE locked_by = 'w1'"
            )  # claimed long ago
            with c.transaction():
                stale = c.execute("SELECT id FROM pgtick.reap_select(60, 100)").fetchall()
                marked = c.execute(
                    "SELECT * FROM pgtick.reap_mark(%s, %s)",
                    ([r[0] for r in stale], [0.0] * len(stale)),
                ).fetchall()
            check(
                len(stale) > 0 and all(m[1] == "failed" for m in marked),
                f"reaped {len(stale)} runs of a silent worker",
            )
            lost = c.execute(
                "SELECT count(*) FROM pgtick.attempts WHERE outcome = 'lost'"
                " AND error_type = 'lease_expired'"
            ).fetchone()
            check(lost is not None and lost[0] == len(stale), "their attempts recorded as lost")

            # Retry of a dead run brings it back with the same id.
            c.execute("SELECT pgtick.retry(%s)", ([ids[0]],))
            row = c.execute(
                "SELECT status, max_attempts FROM pgtick.runs WHERE id = %s", (ids[0],)
            ).fetchone()
            check(row is not None and row[0] == "queued", f"retry of a dead run: {row}")
            n_att = c.execute(
                "SELECT count(*) FROM pgtick.attempts WHERE run_id = %s", (ids[0],)
            ).fetchone()
            check(n_att == (1,), "its folded last attempt became an attempt row")

            # Rotation: live rows are carried, nothing is lost.
            before = c.execute("SELECT count(*) FROM pgtick.queue").fetchone()
            for _ in range(4):
                r = c.execute("SELECT pgtick.rotate(interval '0', 0, 10000)").fetchone()
                print("     rotate:", r[0] if r else None)
            after = c.execute("SELECT count(*) FROM pgtick.queue").fetchone()
            check(before == after, f"rotation keeps every live row ({after})")

            # Flow control: max_running 1 for job type 'lim'.
            c.execute(
                "INSERT INTO pgtick.job_type_limits (job_type, max_running,"
                " max_running_per_key) VALUES ('lim', 2, 1)"
            )
            for key in ("a", "a", "b", "c"):
                c.execute(
                    "SELECT pgtick.enqueue('lim', '{}', now() - interval '1 s', NULL, NULL, 0, %s)",
                    (key,),
                )
            got_l = c.execute(
                "SELECT id, concurrency_key FROM pgtick.claim_limited('w2', 'lim', 60, 3, 10)"
            ).fetchall()
            keys = sorted(r[1] for r in got_l)
            check(keys == ["a", "b"], f"claim_limited: 2 running, one per key: {keys}")
            more = c.execute(
                "SELECT count(*) FROM pgtick.claim_limited('w2', 'lim', 60, 3, 10)"
            ).fetchone()
            check(more == (0,), "no more while 2 are running")

            nd = c.execute("SELECT pgtick.next_due(ARRAY['t'], '{}', '{}', '{}')").fetchone()
            check(nd is not None and nd[0] is not None, f"next_due: {nd}")
            counts = c.execute(
                "SELECT status, count(*) FROM pgtick.runs GROUP BY 1 ORDER BY 1"
            ).fetchall()
            print("     runs by status:", counts)
            exp = c.execute("""SELECT count(*) FROM pgtick.expired_partitions(
                '{"succeeded": "0 days", "dead": "30 days", "cancelled": "7 days",
                  "skipped": "1 day", "longest": "30 days"}')""").fetchone()
            check(exp is not None and exp[0] == 0, "nothing expired yet (partitions from today)")
            # Output: head chunks appended, a tail ring slot upserted.
            c.execute("""INSERT INTO pgtick.output_chunks (run_id, attempt, attempt_started_at,
                             seq, lines) VALUES (1, 1, now(), 0, '[[0, "o", "hello"]]')""")
            c.execute("""INSERT INTO pgtick.output_chunks AS o (run_id, attempt, attempt_started_at,
                             seq, lines, omitted_bytes)
                         VALUES (1, 1, date_trunc('second', now()), -1, '[[9, "e", "tail"]]', 100)
                         ON CONFLICT (run_id, attempt, seq, attempt_started_at)
                         DO UPDATE SET lines = excluded.lines, at = excluded.at,
                                       omitted_bytes = o.omitted_bytes + excluded.omitted_bytes""")
            n_out = c.execute("SELECT count(*) FROM pgtick.output_chunks").fetchone()
            check(n_out == (2,), "output chunks written")
    print("all checks passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
