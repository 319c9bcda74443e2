"""Flow control with real daemons on one database (issue 21's Must show 1-3): max_running and
max_running_per_key never exceeded across 4 daemons x 8 threads, and fully used; a rate held
in every 1-second window; the slots of a SIGKILLed daemon back after lease + reaper, of a
SIGTERMed one at once; a high-priority run ahead of a backlog. What counts is the database's
record (runs, attempts) sampled while it happens, and the handlers' own start/end lines."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from tests.acceptance.cli import pgtick
from tests.acceptance.conftest import HERE, Cluster, wait_for
from tests.dbhelp import Connection

# Timing bars: run alone, after the parallel part of `make test` (docs/development.md).
pytestmark = pytest.mark.serial

DAEMONS = 4
THREADS = 8


def _config(cluster: Cluster, limits: str, **settings: Any) -> Any:
    extra = f"""
[job_types.work]
handler = "flow_jobs:work"
{limits}
"""
    values: dict[str, Any] = {"threads": THREADS, "prefetch": 0, "poll_interval": "1s"}
    values.update(settings)
    return cluster.config(extra, **values)


def _enqueue(conn: Connection, count: int, payload: str = "{}", priority: int = 0) -> None:
    conn.execute(
        "SELECT enqueue('work', %s::jsonb, NULL, NULL, NULL, %s) FROM generate_series(1, %s)",
        [payload, priority, count],
    )


def _succeeded(conn: Connection) -> int:
    row = conn.execute("SELECT count(*) FROM runs WHERE status = 'succeeded'").fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def _sampling(dsn: str, query: str, every: float = 0.01) -> Iterator[list[Any]]:
    """Run ``query`` every ``every`` seconds on a connection of its own while the block runs;
    the first column of each result row is collected."""
    seen: list[Any] = []
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SET search_path TO pgtick")
            while not stop.is_set():
                seen.extend(row[0] for row in c.execute(query).fetchall())
                stop.wait(every)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=10)


def _max_overlap(records: list[dict[str, Any]], key: Any = None) -> int:
    """The most handlers that were between their start and end lines at once (per key)."""
    events = sorted(
        (r["t"], 1 if r["event"] == "start" else -1)
        for r in records
        if r["event"] in ("start", "end") and (key is None or r.get("key") == key)
    )
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_max_running_is_never_exceeded_by_four_daemons_and_is_fully_used(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    # Runs of 0.2 s: a slot's turnaround (the finish committed, the NOTIFY, a claim, a
    # thread) costs some 15 ms with four daemons on two cores, 30 % of a 0.05 s run and 8 %
    # of these; a wake-up missed or a wait for the poll interval still costs a whole second.
    runs, limit, seconds = 500, 3, 0.2
    config = _config(cluster, f"max_running = {limit}")
    for _ in range(DAEMONS):
        cluster.start(config)
    with _sampling(
        dsn, "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'running'"
    ) as running:
        started = time.monotonic()
        _enqueue(conn, runs, f'{{"sleep": {seconds}}}')
        wait_for(lambda: _succeeded(conn) == runs, 120, 0.1, "every run done")
        took = time.monotonic() - started
    assert max(running) <= limit, max(running)
    assert len(running) > 1000  # sampled about every 10 ms throughout
    records = cluster.records()
    assert _max_overlap(records) <= limit
    assert Counter(r["run_id"] for r in records if r["event"] == "start").most_common(1)[0][1] == 1
    ideal = runs * seconds / limit  # 33 s with every slot always busy
    assert took < ideal * 1.25, f"{took:.1f}s for {runs} runs; the limit allows {ideal:.1f}s"


def test_one_run_per_key_at_a_time_and_every_key_progresses(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    keys, per_key = 20, 30
    config = _config(cluster, 'concurrency_key = "payload.customer"\nmax_running_per_key = 1')
    for _ in range(DAEMONS):
        cluster.start(config)
    # Key c0's runs all come first: a claim that went by age alone would serve only c0.
    for k in range(keys):
        _enqueue(conn, per_key, f'{{"customer": "c{k}", "sleep": 0.02}}')
    with _sampling(
        dsn,
        "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'running'"
        " GROUP BY payload->>'customer' ORDER BY 1 DESC LIMIT 1",
    ) as most_per_key:
        wait_for(lambda: _succeeded(conn) == keys * per_key, 120, 0.1, "every run done")
    assert most_per_key and max(most_per_key) == 1, max(most_per_key)
    records = cluster.records()
    for k in range(keys):
        assert _max_overlap(records, f"c{k}") == 1, f"c{k}"
    # Every key progressed from the start: each had its first run started within 4 s, where
    # serving by age would start c19 after the 19 keys before it (about 19 x 30 x 20 ms, 11 s).
    # Not 1 s: when each key's runs are contiguous, a claim's scan of `room` candidates finds
    # one new key, so the 20 first runs take about 20 claims (0.8-1.1 s when written; at 1.13 s
    # the CI at 99eda7d failed a 1 s bar). Not 2 s either: 1.3-1.9 s in six local runs on
    # 2026-11-27, with or without the hot path's generic plans, and 2.06 s in a CI run.
    first = {}
    for r in sorted((r for r in records if r["event"] == "start"), key=lambda r: r["t"]):
        first.setdefault(r["key"], r["t"])
    began = min(first.values())
    assert len(first) == keys
    assert max(first.values()) - began < 4.0, sorted(first.items(), key=lambda kv: kv[1])[-3:]


def _big_key_then_forty_others(
    cluster: Cluster, conn: Connection, limit: str, big: str
) -> list[dict[str, Any]]:
    """One daemon with a per-key ``limit``; ten runs of ``big`` (payload), then, 1.5 s later
    (more than the claim bound's margin), ten runs of 0.2 s for each of 40 other keys, which
    keep the daemon's claims finding runs. The jobs' log once every run is done."""
    cluster.start(_config(cluster, f'concurrency_key = "payload.customer"\n{limit}'))
    _enqueue(conn, 10, big)
    time.sleep(1.5)
    for k in range(40):
        _enqueue(conn, 10, f'{{"customer": "c{k}", "sleep": 0.2}}')
    wait_for(lambda: _succeeded(conn) == 410, 120, 0.1, "every run done")
    return cluster.records()


def test_a_busy_keys_older_runs_follow_one_another_while_other_keys_keep_claims_busy(
    cluster: Cluster, conn: Connection
) -> None:
    """A claim skips the runs of a key at its limit and takes other keys' later runs, and the
    claim's keyset bound moves past the busy key's older runs. While other keys kept every
    claim finding runs, each next run of the busy key waited for the claim's look back (up to
    5 s) once its slot came free; the freed slot now announces the finished run's due second,
    and they follow one another."""
    records = _big_key_then_forty_others(
        cluster, conn, "max_running_per_key = 1", '{"customer": "big", "sleep": 0.3}'
    )  # big's fourth or fifth run is under way when the others come
    big = sorted(r["t"] for r in records if r.get("key") == "big")
    others = sorted(r["t"] for r in records if r.get("key") not in (None, "big"))
    assert len(big) == 20  # a start and an end line each
    # 10 runs of 0.3 s back to back: about 3 s. Before: after the other keys came, one run of
    # big per look back (5 s) while their 400 runs kept 7 threads busy: 14.0 s.
    span = big[-1] - big[0]
    assert span < 6.0, f"big: {span:.1f} s; the other keys: {others[-1] - others[0]:.1f} s"


def test_a_rate_holds_in_every_one_second_window(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    rate, window_seconds, span = 60, 1.0, 60.0
    config = _config(cluster, f'rate = "{rate}/second"')
    for _ in range(DAEMONS):
        cluster.start(config)
    _enqueue(conn, int(rate * span * 1.5))
    time.sleep(span + 1)
    starts = [
        row[0]
        for row in conn.execute(
            "SELECT extract(epoch FROM a.started_at)::float8 FROM attempts a"
            " JOIN runs r ON r.id = a.run_id WHERE r.job_type = 'work' ORDER BY 1"
        ).fetchall()
    ]
    cluster.stop_all()
    first = starts[0]
    inside = [t for t in starts if t < first + span]
    # Every window of one second that starts at a start (the fullest ones do).
    j = 0
    fullest = 0
    for i, t in enumerate(inside):
        while j < len(inside) and inside[j] < t + window_seconds:
            j += 1
        fullest = max(fullest, j - i)
    assert fullest <= rate, fullest
    assert abs(len(inside) - rate * span) <= 0.05 * rate * span, len(inside)
    # The runs held back stayed queued with no attempt counted.
    row = conn.execute(
        "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'queued' AND attempts = 0"
    ).fetchone()
    assert row is not None and row[0] > 0


def test_a_keys_rate_is_used_while_other_keys_keep_claims_busy(
    cluster: Cluster, conn: Connection
) -> None:
    """A claim skips the runs of a key over its rate and takes other keys' later runs, so the
    keyset bound moves past the key's older runs, and nothing announces when its window lets
    it start again. They waited for the claim's look back (every 5 s), a key limited to 2 a
    second starting 2 every 5 s; a window after a claim, the bound is now put back to the
    earliest run_at it took."""
    records = _big_key_then_forty_others(
        cluster, conn, 'rate_per_key = "2/second"', '{"customer": "big"}'
    )  # big's first runs have started when the others come
    starts = sorted(r["t"] for r in records if r.get("key") == "big" and r["event"] == "start")
    assert len(starts) == 10
    # 2 a second: the 10 runs over about 4.5 s. Before: 2 per look back once the others came.
    span = starts[-1] - starts[0]
    assert span < 7.0, f"big started over {span:.1f} s: {[round(t - starts[0], 1) for t in starts]}"


def test_slots_of_a_killed_daemon_return_after_lease_and_reaper_and_of_a_stopped_one_at_once(
    cluster: Cluster, conn: Connection
) -> None:
    lease, reaper = 3.0, 1.0
    settings = {"lease": f"{lease:g}s", "heartbeat": "1s", "reaper": f"{reaper:g}s"}
    limits = 'max_running = 2\nbackoff = "fixed"\nbackoff_base = "1s"\njitter = 0'
    config = _config(cluster, limits, **settings)
    first = cluster.start(config)
    _enqueue(conn, 2, '{"sleep": 60, "retry_sleep": 0.5}')
    wait_for(lambda: len(cluster.executions("start")) == 2, 10, what="both slots taken")
    second = cluster.start(config)
    _enqueue(conn, 2, '{"sleep": 0.5}')
    time.sleep(1.0)
    assert len(cluster.executions("start")) == 2  # the limit holds the newer runs back
    first.signal(signal.SIGKILL)
    first.wait(10)
    killed_at = time.time()
    wait_for(lambda: _succeeded(conn) == 4, lease + reaper + 15, 0.05, "all four runs")
    by_second = [r for r in cluster.records() if r["event"] == "start" and r["pid"] == second.pid]
    # The slots came back within lease + reaper interval (and a claim's moment).
    assert min(r["t"] for r in by_second) - killed_at <= lease + reaper + 1.0
    starts = cluster.executions("start")
    killed = [r["run_id"] for r in cluster.records() if r["pid"] == first.pid]
    assert len(killed) == 2 and all(starts[run_id] == 2 for run_id in killed), starts
    assert sorted(starts.values()) == [1, 1, 2, 2]  # the killed runs ran again, once
    assert _max_overlap([r for r in cluster.records() if r["pid"] == second.pid]) <= 2

    # SIGTERM: the second daemon finishes what it runs, and a third takes the slots the
    # moment those results are written, not a lease later. The second's two runs last until
    # the file exists (a third daemon slow to start on a loaded machine must not find them
    # over, the second having taken the others meanwhile); the others are queued behind them.
    release = cluster.tmp_path / "release-the-second"
    _enqueue(conn, 2, json.dumps({"until": str(release)}))
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM runs WHERE status = 'running' AND payload ? 'until'"
            ).fetchone()
            == (2,)
        ),
        10,
        what="the second daemon holds both slots",
    )
    _enqueue(conn, 2, '{"sleep": 0.5}')
    third = cluster.start(config)
    second.signal(signal.SIGTERM)
    time.sleep(0.5)  # its drain has begun: it claims nothing more
    release.touch()
    assert second.wait(30) == 0
    wait_for(lambda: _succeeded(conn) == 8, 15, what="the last runs, on the third daemon")
    records = cluster.records()
    ended = max(r["t"] for r in records if r["event"] == "end" and r["pid"] == second.pid)
    taken = min(r["t"] for r in records if r["event"] == "start" and r["pid"] == third.pid)
    assert taken - ended < 0.5, taken - ended


def test_a_high_priority_run_goes_ahead_of_a_backlog(cluster: Cluster, conn: Connection) -> None:
    config = _config(cluster, "", threads=4)
    cluster.start(config)
    _enqueue(conn, 10_000, '{"sleep": 0.005}')
    wait_for(lambda: _succeeded(conn) > 200, 30, what="the backlog under way")
    urgent = []
    for _ in range(20):
        row = conn.execute(
            "SELECT enqueue('work', '{\"urgent\": true}', NULL, NULL, NULL, 10)"
        ).fetchone()
        assert row is not None
        urgent.append(row[0])
        time.sleep(0.1)
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status = 'succeeded'", [urgent]
            ).fetchone()
            == (len(urgent),)
        ),
        30,
        what="the urgent runs",
    )
    delays = sorted(
        row[0]
        for row in conn.execute(
            "SELECT extract(epoch FROM started_at - created_at)::float8 FROM runs"
            " WHERE id = ANY(%s)",
            [urgent],
        ).fetchall()
    )
    left = conn.execute(
        "SELECT count(*) FROM runs WHERE status = 'queued' AND job_type = 'work'"
    ).fetchone()
    assert left is not None and left[0] > 1000  # the backlog was still there throughout
    # Every thread busy with 5 ms runs: the urgent run takes the next free thread.
    assert delays[-1] < 0.1, delays


def test_status_and_show_say_what_a_limit_holds_back(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    config = _config(cluster, "max_running = 1")
    cluster.start(config)
    env = {"PGTICK_CONFIG": str(config), "PYTHONPATH": str(HERE)}
    args = ("enqueue", "work", "--payload", '{"sleep": 30}')
    first = pgtick(dsn, *args, "--priority", "5", "--concurrency-key", "k1", env=env)
    assert first.code == 0, first.err
    wait_for(lambda: cluster.executions("start"), 10, what="the first run started")
    second = pgtick(dsn, *args, env=env)
    assert second.code == 0, second.err

    status = pgtick(dsn, "status", env=env)
    assert "HELD BACK" in status.text and "1 on concurrency" in status.text, status.text
    assert "work: max_running 1" in status.text, status.text
    fields = json.loads(pgtick(dsn, "status", "--json", env=env).text)
    [work] = [t for t in fields["job_types"] if t["job_type"] == "work"]
    assert (work["limits"], work["waiting_concurrency"], work["waiting_rate"]) == (
        "max_running 1 (config)",  # each limit with where it comes from (issue 45)
        1,
        0,
    )
    shown = pgtick(dsn, "show", second.text.strip(), env=env).text
    assert "held back by a concurrency limit (max_running 1; 1 held now)" in shown, shown
    running = json.loads(pgtick(dsn, "show", first.text.strip(), "--json", env=env).text)
    assert (running["priority"], running["concurrency_key"], running["waiting"]) == (5, "k1", None)


def test_a_limit_changed_by_a_rolling_restart_loses_and_repeats_nothing(
    cluster: Cluster, conn: Connection, dsn: str
) -> None:
    """max_running 2 on the first daemon; a second daemon with max_running 4 starts, then the
    first stops (SIGTERM): the runs go on under the new limit, each run once."""
    runs = 60
    old = cluster.start(_config(cluster, "max_running = 2"))
    with _sampling(
        dsn, "SELECT count(*) FROM runs WHERE job_type = 'work' AND status = 'running'"
    ) as running:
        _enqueue(conn, runs, '{"sleep": 0.2}')
        wait_for(lambda: _succeeded(conn) >= 10, 30, what="runs under the old limit")
        before = max(running)
        new = cluster.start(_config(cluster, "max_running = 4"))
        old.signal(signal.SIGTERM)
        assert old.wait(30) == 0
        wait_for(lambda: _succeeded(conn) == runs, 60, 0.1, "every run done")
    assert before <= 2, before
    assert max(running) <= 4, max(running)
    records = cluster.records()
    starts = Counter(r["run_id"] for r in records if r["event"] == "start")
    assert len(starts) == runs and set(starts.values()) == {1}, starts.most_common(3)
    assert _max_overlap([r for r in records if r["pid"] == new.pid]) > 2  # the new limit used
    # Each run succeeded once; a run claimed in the moment the first daemon stopped was given
    # back unstarted (released), never failed or lost.
    rows = conn.execute(
        "SELECT a.outcome, count(*) FROM attempts a JOIN runs r ON r.id = a.run_id"
        " WHERE r.job_type = 'work' GROUP BY a.outcome"
    ).fetchall()
    assert dict(rows).get("succeeded") == runs and set(dict(rows)) <= {"succeeded", "released"}
