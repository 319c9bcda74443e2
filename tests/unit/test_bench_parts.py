"""The queue-health and soak parts without a database: their timelines, the report math (ratios,
bars, trends, exactly-once), the claim's recognition in pg_stat_statements text, each
statement named by its queries.sql block. Their usage errors are with the others in
test_bench."""

from __future__ import annotations

import json
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from bench import common, load, queue_health, soak, statements

REPO = Path(__file__).resolve().parents[2]

# Statement texts as pg_stat_statements shows them (constants replaced by $n).
PGTICK_CLAIM = """WITH types AS ( SELECT * FROM unnest($1::text[], $2::float8[], $3::int[])
    AS t(job_type, lease, max_attempts) ), candidates AS ( SELECT c.id, c.run_at FROM types t
    CROSS JOIN LATERAL ( SELECT r.id, r.run_at FROM runs r WHERE r.job_type = t.job_type
    AND r.status IN ($4, $5) AND r.run_at <= now() ORDER BY r.run_at, r.id LIMIT $6
    FOR UPDATE SKIP LOCKED ) c ), picked AS ( SELECT id FROM candidates LIMIT $7 ),
    claimed AS ( UPDATE runs r SET status = $8, locked_by = $9 FROM picked, types t
    WHERE r.id = picked.id RETURNING r.id ), opened AS ( INSERT INTO attempts (run_id)
    SELECT id FROM claimed ) SELECT * FROM claimed"""
PGQUEUER_DEQUEUE = """WITH next_queued AS ( SELECT job.id FROM available CROSS JOIN LATERAL (
    SELECT candidate.id FROM pgqueuer candidate WHERE candidate.status = $1 LIMIT $2
    FOR UPDATE SKIP LOCKED ) job ), updated AS ( UPDATE pgqueuer AS job SET status = $3,
    updated = NOW() FROM next_queued WHERE job.id = next_queued.id RETURNING job.* )
    SELECT * FROM updated"""
REAP_SELECT = """SELECT id, job_type FROM runs WHERE status = $1 AND locked_until < now()
    ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED"""
PRUNE = """WITH victims AS ( SELECT id FROM runs WHERE status = $1 LIMIT $2
    FOR UPDATE SKIP LOCKED ) DELETE FROM runs r USING victims v WHERE r.id = v.id"""
SUCCEED = """WITH done AS ( UPDATE runs r SET status = $1 WHERE r.id = ANY($2::bigint[])
    RETURNING r.id ) SELECT id FROM done"""


# -- the timelines ------------------------------------------------------------------------------


def test_the_pinned_windows_tile_the_pin_backwards_from_its_release() -> None:
    plan = queue_health.windows(60, 240, 60)
    assert [(w.start, w.end, w.pinned) for w in plan] == [
        (0, 60, False),
        (60, 120, True),
        (120, 180, True),
        (180, 240, True),
        (240, 300, True),
    ]
    assert plan[-1].label == "pin 180-240 s"
    # A pin that is no multiple of the window leaves its first seconds unmeasured.
    odd = queue_health.windows(15, 25, 10)
    assert [(w.start, w.end) for w in odd] == [(5, 15), (20, 30), (30, 40)]
    assert queue_health.boundaries(15, 25, 10) == [5, 15, 20, 30, 40]


def test_soak_samples_every_interval_and_at_the_end() -> None:
    assert soak.sample_offsets(600, 60) == [60.0 * i for i in range(1, 11)]
    assert soak.sample_offsets(50, 20) == [20.0, 40.0, 50.0]
    assert soak.sample_offsets(20, 20) == [20.0]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2m", 120.0), ("30s", 30.0), ("1h30m", 5400.0), ("250ms", 0.25), ("45", 45.0)],
)
def test_retention_durations_are_read_as_pgtick_reads_them(text: str, seconds: float) -> None:
    assert soak.duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["2 minutes", "m", "2x", ""])
def test_a_bad_retention_is_a_usage_error(text: str) -> None:
    with pytest.raises(common.BenchError) as info:
        soak.duration_seconds(text)
    assert info.value.code == 2


# -- the math -----------------------------------------------------------------------------------


def test_ratio_below_and_verdict_leave_missing_figures_unjudged() -> None:
    assert load.ratio(6.0, 2.0) == 3.0
    assert load.ratio(None, 2.0) is None and load.ratio(1.0, 0.0) is None
    assert load.below(2.99, 3.0) is True and load.below(3.0, 3.0) is False
    assert load.below(None, 3.0) is None
    assert [load.verdict(v) for v in (True, False, None)] == ["pass", "FAIL", "n/a"]


def test_growth_tells_a_flat_series_from_a_rising_one() -> None:
    assert load.growth([5.0, 5.2, 4.9, 5.1]) == pytest.approx(5.0 / 5.1)
    assert load.flat([5.0, 5.2, 4.9, 5.1]) is True
    # Linear in the hold: 15 one-minute windows of a 15-minute pin.
    rising = [float(m) for m in range(1, 16)]
    assert load.growth(rising) == pytest.approx(12.0 / 4.0)  # minutes 9-15 over 1-7
    assert load.flat(rising) is False
    # The middle of an odd series counts for neither half; missing values are skipped.
    assert load.growth([1.0, 100.0, 3.0]) == 3.0
    assert load.growth([2.0, None, 4.0]) == 2.0
    assert load.growth([7.0]) is None and load.flat([]) is None


def test_statement_deltas_count_new_statements_from_zero_and_drop_idle_ones() -> None:
    before = {1: load.Statement("claim", 10, 5.0, 40, 1.0), 2: load.Statement("idle", 3, 1, 3, 1)}
    after = {
        1: load.Statement("claim", 30, 25.0, 120, 2.0),
        2: load.Statement("idle", 3, 1, 3, 1),
        3: load.Statement("new", 4, 2.0, 0, 1.0),
    }
    deltas = load.statement_deltas(before, after)
    assert set(deltas) == {1, 3}
    assert (deltas[1].calls, deltas[1].total_ms, deltas[1].rows) == (20, 20.0, 80)
    assert deltas[1].mean_ms == 1.0
    assert deltas[1].per_row_us == 250.0  # 20 ms over 80 claimed runs
    assert deltas[3].per_row_us is None  # no rows: no time per row


def test_the_claim_is_recognised_by_its_shape_in_normalised_text() -> None:
    assert load.CLAIM.search(PGTICK_CLAIM)
    assert load.CLAIM.search(PGQUEUER_DEQUEUE)
    for other in (REAP_SELECT, PRUNE, SUCCEED):
        assert not load.CLAIM.search(other)
    deltas = {
        1: load.StatementDelta(PGTICK_CLAIM, 10, 4.0, 40),
        2: load.StatementDelta(PGTICK_CLAIM + " ", 10, 6.0, 10),
        3: load.StatementDelta(SUCCEED, 50, 9.0, 50),
    }
    claim = load.combined(deltas, load.CLAIM)
    assert (claim.calls, claim.total_ms, claim.rows) == (20, 10.0, 50)
    assert claim.per_row_us == 200.0


def test_utility_statements_are_left_out() -> None:
    for text in ("BEGIN", "commit", "SET search_path TO pgtick", "LISTEN pgtick", "SHOW x"):
        assert load.UTILITY.match(text)
    for text in (PGTICK_CLAIM, "SELECT now()", "  UPDATE workers SET heartbeat_at = now()"):
        assert not load.UTILITY.match(text)


def test_exactly_once_finds_missing_repeated_and_unknown_ids(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.write_text("1\n2\n2\n4 1.0 2.0\n\n")
    counts = load.ledger_counts(ledger)
    assert counts == Counter({1: 1, 2: 2, 4: 1})
    assert load.exactly_once([1, 2, 3], counts) == {
        "enqueued": 3,
        "distinct_enqueued": 3,
        "missing": 1,
        "repeated": 1,
        "unknown": 1,
    }
    assert load.ledger_counts(tmp_path / "none") == Counter()


def test_a_metric_is_read_by_name_with_its_labels() -> None:
    body = (
        "# HELP pgtick_run_attempts_total Attempts finished by this daemon\n"
        'pgtick_run_attempts_total{job_type="ledger",outcome="succeeded"} 1200.0\n'
        'pgtick_run_attempts_total{job_type="ledger",outcome="failed"} 0.0\n'
        'pgtick_run_attempts_created{job_type="ledger",outcome="failed"} 1.7e+09\n'
    )
    samples = load.parse_metric(body, "pgtick_run_attempts_total")
    assert samples == {
        (("job_type", "ledger"), ("outcome", "succeeded")): 1200.0,
        (("job_type", "ledger"), ("outcome", "failed")): 0.0,
    }


def test_a_histogram_quantile_is_read_between_two_scrapes_as_promql_reads_it() -> None:
    inf = float("inf")
    body = (
        'pgtick_claim_duration_seconds_bucket{le="0.001"} 10.0\n'
        'pgtick_claim_duration_seconds_bucket{le="0.002"} 60.0\n'
        'pgtick_claim_duration_seconds_bucket{le="0.005"} 100.0\n'
        'pgtick_claim_duration_seconds_bucket{le="+Inf"} 100.0\n'
        "pgtick_claim_duration_seconds_count 100.0\n"
    )
    later = {
        float(dict(labels)["le"]): value
        for labels, value in load.parse_metric(body, "pgtick_claim_duration_seconds_bucket").items()
    }
    assert later == {0.001: 10.0, 0.002: 60.0, 0.005: 100.0, inf: 100.0}
    # p99: rank 99 falls in (0.002, 0.005], 39 of its 40 counts in.
    assert load.quantile(0.99, later, {}) == pytest.approx(0.002 + 0.003 * 39 / 40)
    assert load.quantile(0.5, later, {}) == pytest.approx(0.001 + 0.001 * 40 / 50)
    # Only what was counted since the earlier scrape: the 40 claims above 2 ms.
    earlier = {0.001: 10.0, 0.002: 60.0, 0.005: 60.0, inf: 60.0}
    assert load.quantile(0.5, later, earlier) == pytest.approx(0.002 + 0.003 * 20 / 40)
    assert load.quantile(0.99, later, later) is None
    # Beyond the largest finite bound: that bound, as histogram_quantile says.
    assert load.quantile(0.99, {0.001: 0.0, inf: 5.0}, {}) == 0.001


def window(
    label: str, pinned: bool, p99: float | None, per_run: float | None, stmts: dict[str, Any]
) -> dict[str, Any]:
    pickup = {"n": 100, "p50": 1.0, "p99": p99} if p99 is not None else {"n": 0}
    return {
        "label": label,
        "pinned": pinned,
        "pickup_ms": pickup,
        "claim": {"per_run_us": per_run},
        "statements": stmts,
        "dead_at_end": 0,
        "live_at_end": 0,
        "bytes_at_end": 0,
    }


def stmt(calls: int, mean: float) -> dict[str, Any]:
    return {"query": "q", "calls": calls, "mean_ms": mean}


def test_the_bars_compare_the_last_pinned_window_with_the_baseline() -> None:
    rows = [
        window("baseline", False, 6.0, 40.0, {"1": stmt(500, 0.1), "2": stmt(5, 1.0)}),
        window("pin 0-60 s", True, 7.0, 60.0, {"1": stmt(500, 0.15)}),
        window("pin 60-120 s", True, 17.0, 110.0, {"1": stmt(500, 0.25), "2": stmt(6, 9.0)}),
    ]
    v = queue_health.verdicts(rows, {"ok": True}, min_calls=10)
    assert v["pickup_p99_ratio"] == pytest.approx(17.0 / 6.0)
    assert v["pickup_p99_ok"] is True  # 2.8x and 17 ms < 50 ms
    assert v["claim_per_run_ratio"] == pytest.approx(2.75) and v["claim_per_run_ok"] is True
    # Statement 2 rose 9x but has too few calls to be judged.
    assert [(s["statement"], s["ok"]) for s in v["statements"]] == [("2", None), ("1", True)]
    assert v["statements_ok"] is True and v["worst_statement_ratio"] == pytest.approx(2.5)
    assert v["nothing_left_behind"] is True
    assert v["pickup_p99_growth"] == pytest.approx(17.0 / 7.0) and v["pickup_p99_flat"] is False


def test_one_statement_counted_under_two_queryids_is_compared_as_one() -> None:
    """PostgreSQL can count a statement under a new queryid part-way through a run (seen
    with the finish under a pin): its windows must still meet their baseline by text."""
    finish = "WITH done AS ( UPDATE runs r\n  SET status = $1 ... ) SELECT id FROM done"
    base = load.StatementDelta(finish, 100, 30.0, 400)
    early = load.StatementDelta(" ".join(finish.split()), 40, 28.0, 160)
    later = load.StatementDelta(finish, 60, 150.0, 240)
    before = queue_health.statement_figures({1: base})
    after = queue_health.statement_figures({1: early, 2: later})
    assert list(after) == list(before)  # one statement, same key
    [figures] = after.values()
    assert figures["calls"] == 100 and figures["mean_ms"] == pytest.approx(1.78)
    rows = [
        window("baseline", False, 1.0, 40.0, before),
        window("pin", True, 1.0, 40.0, after),
    ]
    [ratio] = queue_health.verdicts(rows, {"ok": True}, min_calls=10)["statements"]
    assert ratio["ratio"] == pytest.approx(1.78 / 0.3) and ratio["ok"] is False


def test_a_pickup_p99_over_50_ms_fails_even_below_3x() -> None:
    rows = [
        window("baseline", False, 20.0, 40.0, {}),
        window("pin", True, 55.0, 200.0, {"1": stmt(50, 1.0)}),
    ]
    v = queue_health.verdicts(rows, {"ok": False}, min_calls=10)
    assert v["pickup_p99_ok"] is False
    assert v["claim_per_run_ok"] is False
    assert v["statements_ok"] is None  # nothing called in both windows
    assert v["nothing_left_behind"] is False
    assert v["pickup_p99_flat"] is None  # one pinned window: no trend


def test_the_size_bar_compares_the_middle_sample_with_the_last() -> None:
    samples = [{"t_s": 60.0 * i, "bytes": 100 + i} for i in range(1, 11)]
    bar = soak.size_bar(samples)
    assert (bar["middle_t_s"], bar["end_t_s"]) == (300.0, 600.0)
    assert bar["change"] == pytest.approx(110 / 105 - 1) and bar["ok"] is True
    samples[-1]["bytes"] = 128
    assert soak.size_bar(samples)["ok"] is False


def test_the_daemon_config_holds_the_load_handlers_and_the_retention(tmp_path: Path) -> None:
    path = load.daemon_config(
        tmp_path / "c.toml",
        settings={"worker": {"threads": 4}},
        retention={"succeeded": "2m"},
    )
    config = tomllib.loads(path.read_text())
    assert config["worker"] == {"imports": ["bench.jobs", "bench.load_jobs"], "threads": 4}
    assert config["retention"] == {"succeeded": "2m"}
    assert config["metrics"] == {"listen": "127.0.0.1:0"}
    assert "retention" not in tomllib.loads(
        load.daemon_config(tmp_path / "d.toml", settings={}).read_text()
    )


def test_the_producer_keeps_a_steady_rate_in_small_batches() -> None:
    batches: list[int] = []

    def connect() -> tuple[load.Enqueuer, Any]:
        def enqueue(count: int) -> list[int]:
            batches.append(count)
            start = sum(batches) - count
            return list(range(start, start + count))

        return enqueue, lambda: None

    producer = load.Producer(connect, rate=1000)
    producer.start()
    time.sleep(0.3)
    producer.finish()
    producer.check()
    assert abs(len(producer.ids) - 1000 * producer.seconds) <= 20
    assert list(producer.ids) == list(range(len(producer.ids)))
    assert max(batches) <= 100  # 10 ms of the rate, not a burst (some slack for a busy host)


def test_a_failing_producer_reports_its_error() -> None:
    def connect() -> tuple[load.Enqueuer, Any]:
        def enqueue(count: int) -> list[int]:
            raise RuntimeError("connection lost")

        return enqueue, lambda: None

    producer = load.Producer(connect, rate=1000)
    producer.start()
    producer.join(5)
    with pytest.raises(common.BenchError, match="connection lost"):
        producer.check()


# -- statements by block ------------------------------------------------------------------------

# As PostgreSQL 15's pg_stat_statements showed them (a daemon's, psycopg's $n parameters): the
# field of extract() and every literal are constants there.
PLANNER_HINTS = """SELECT set_config($1, $2, $3), set_config($4, $5, $6),
       set_config($7, $8, $9), set_config($10, $11, $12)"""
NEXT_DUE = """SELECT extract($3 FROM min(n.run_at) - now())::float8
FROM unnest($1::text[], $2::timestamptz[]) AS t(job_type, low)
CROSS JOIN LATERAL (
    (SELECT r.run_at
     FROM "pgtick".runs r
     WHERE r.job_type = t.job_type AND r.status IN ($4, $5) AND r.priority = $6
       AND r.run_at >= coalesce(t.low, $7)
     ORDER BY r.run_at
     LIMIT $8)
    UNION ALL
    (SELECT min(p.run_at)
     FROM (SELECT r.run_at
           FROM "pgtick".runs r
           WHERE r.job_type = t.job_type AND r.status IN ($9, $10) AND r.priority > $11
           ORDER BY r.priority DESC, r.run_at, r.id) p)
    UNION ALL
    (SELECT min(p.run_at)
     FROM (SELECT r.run_at
           FROM "pgtick".runs r
           WHERE r.job_type = t.job_type AND r.status IN ($12, $13) AND r.priority < $14
           ORDER BY r.priority DESC, r.run_at, r.id) p)
) n"""


def test_statements_are_named_by_their_block_whatever_their_constants() -> None:
    assert statements.name_of(PLANNER_HINTS) == "planner_hints"
    assert statements.name_of(NEXT_DUE) == "next_due"
    assert statements.name_of("SELECT pg_backend_pid()") == "backend_pid"
    # NULL, true and false are constants to pg_stat_statements; IS NULL and a typed literal's
    # type name come out the same either way.
    a = "SELECT NULL, x IS NULL, interval '1 second', true FROM t WHERE y = %(y)s"
    b = "SELECT $1, x IS NULL, $2, $3 FROM t WHERE y = $4"
    c = "SELECT $1, x IS $2, interval $3, $4 FROM t WHERE y = $5"
    assert statements.signature(a) == statements.signature(b) == statements.signature(c)
    assert statements.name_of("SELECT count(*) FROM pgqueuer WHERE status = $1") == (
        "sql: SELECT count(*) FROM pgqueuer WHERE status = $1"
    )


def test_blocks_are_compared_per_call_and_per_claimed_run() -> None:
    def deltas(claimed: int, finish_ms: float, finishes: int) -> dict[int, load.StatementDelta]:
        return {
            1: load.StatementDelta(PGTICK_CLAIM, 100, 50.0, claimed, 3000),
            2: load.StatementDelta(PLANNER_HINTS, 200, claimed / 500, 200, 0),  # 2 us a run
            3: load.StatementDelta(NEXT_DUE, 5, 1.0, 5, 50),
            4: load.StatementDelta(NEXT_DUE.replace("\n", " "), 5, 1.0, 5, 50),  # a second id
            5: load.StatementDelta(SUCCEED, finishes, finish_ms, claimed, 900),
        }

    first = statements.window_figures(deltas(claimed=1000, finish_ms=20.0, finishes=100))
    last = statements.window_figures(deltas(claimed=500, finish_ms=30.0, finishes=50))
    assert first["claimed_runs"] == 1000
    assert first["blocks"]["next_due"]["calls"] == 10  # both queryids, one block
    rows = {r["statement"]: r for r in statements.compare(first, last, 2.0, min_calls=20)}
    claim = rows[statements.name_of(PGTICK_CLAIM)]
    assert claim["us_per_call_first"] == pytest.approx(500.0)
    assert claim["us_per_run_first"] == pytest.approx(50.0)
    assert claim["us_per_run_last"] == pytest.approx(100.0)  # half the runs for the same time
    assert claim["per_run_ratio"] == pytest.approx(2.0) and claim["ok"] is False
    finish = rows[statements.name_of(SUCCEED)]
    assert finish["per_call_ratio"] == pytest.approx(3.0)
    assert finish["per_run_ratio"] == pytest.approx(3.0) and finish["ok"] is False
    assert finish["buffers_per_call_first"] == pytest.approx(9.0)
    assert rows["planner_hints"]["ok"] is True
    assert rows["next_due"]["ok"] is None  # 10 calls: not judged
    v = statements.verdict(list(rows.values()))
    assert v == {"judged": 3, "worst_per_run_ratio": pytest.approx(3.0), "ok": False}


def test_the_soak_compares_its_last_interval_with_the_first_a_minute_in() -> None:
    samples = [{"t_s": 60.0 * i, "interval_s": 60.0} for i in range(1, 6)]
    assert soak.reference_sample(samples)["t_s"] == 120.0  # minute 2
    assert soak.interval_label(soak.reference_sample(samples)) == "60-120s"
    thirty = [{"t_s": 30.0 * i, "interval_s": 30.0} for i in range(1, 5)]
    assert soak.reference_sample(thirty)["t_s"] == 90.0  # 60-90 s
    short = [{"t_s": 60.0, "interval_s": 60.0}, {"t_s": 120.0, "interval_s": 60.0}]
    assert soak.reference_sample(short)["t_s"] == 60.0  # the only one before the last


def test_two_records_started_in_one_second_each_keep_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two torture seeds started side by side wrote one file: the second replaced the first."""
    monkeypatch.setenv(common.RESULTS_ENV, str(tmp_path))
    first = common.Record("torture", command=["a"], options={"seed": 1})
    second = common.Record("torture", command=["b"], options={"seed": 2}, started=first.started)
    paths = [first.write(), second.write()]
    assert len(set(paths)) == 2
    assert [json.loads(p.read_text())["options"]["seed"] for p in paths] == [1, 2]
