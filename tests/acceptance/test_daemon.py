"""Issue 3 "Must show": `pgtick run` as real processes on a real PostgreSQL."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import time
from pathlib import Path

import pytest

from tests.dbhelp import Connection, NewRun, Runs

from .conftest import Cluster, left_behind, status_counts, wait_for
from .test_metrics import sample, scrape, start_with_metrics

# The handler may see the cancellation this long after the next heartbeat (a busy machine).
LOST_LEASE_SLACK_SECONDS = 0.75


@pytest.mark.timeout(180)
def test_three_daemons_drain_5000_runs_each_exactly_once(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 1."""
    daemons = [cluster.start() for _ in range(3)]
    ids = store.enqueue_many([NewRun("record", {"n": i}) for i in range(5000)])
    wait_for(lambda: status_counts(conn) == {"succeeded": 5000}, 90, 0.2, "all succeeded")
    executions = cluster.executions()
    assert set(executions) == set(ids)
    assert set(executions.values()) == {1}
    pids = {r["pid"] for r in cluster.records()}
    families = [d.family() for d in daemons]  # with worker processes, theirs
    assert pids <= set().union(*families)
    assert all(pids & family for family in families)  # all three took part
    for daemon in daemons:
        daemon.signal(signal.SIGTERM)
    assert [d.wait(20) for d in daemons] == [0, 0, 0]
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)
    attempts = conn.execute("SELECT outcome, count(*) FROM attempts GROUP BY outcome").fetchall()
    assert attempts == [("succeeded", 5000)]


@pytest.mark.timeout(180)
def test_sigkill_mid_way_only_the_killed_daemons_runs_run_twice(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 2: lease 3 s, reaper 1 s; runs held by the killed daemon run again soon."""
    lease, reaper = 3.0, 1.0
    config = cluster.config(lease="3s", heartbeat="1s", reaper="1s")
    victim, *others = [cluster.start(config) for _ in range(3)]
    store.enqueue_many([NewRun("record", {"sleep": 0.05}) for _ in range(2000)])
    wait_for(lambda: len(cluster.executions()) > 300, 30, what="work under way")
    victim_ids = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM workers WHERE pid = ANY(%s)", [list(victim.family())]
        ).fetchall()
    ]
    assert victim_ids
    # The whole daemon, as the OOM killer or systemd's SIGKILL of the unit's cgroup: with
    # worker processes, a SIGKILL of the supervisor alone lets them finish what they run.
    for pid in victim.workers():
        os.kill(pid, signal.SIGKILL)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    killed_at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    held = {
        r[0]
        for r in conn.execute(
            "SELECT id FROM runs WHERE status = 'running' AND locked_by = ANY(%s)", [victim_ids]
        )
    }
    assert held, "the victim held runs when it was killed"

    wait_for(lambda: status_counts(conn) == {"succeeded": 2000}, 120, 0.2, "all succeeded")
    left = left_behind(conn, victim_ids, held)
    twice = {run_id for run_id, n in cluster.executions().items() if n > 1}
    assert twice <= left
    assert max(cluster.executions().values()) <= 2
    # Runs that were the victim's ran again elsewhere within lease + reaper interval (+ slack).
    rows = conn.execute(
        "SELECT run_id, min(started_at) FROM attempts "
        "WHERE run_id = ANY(%s) AND worker_id <> ALL(%s) GROUP BY run_id",
        [list(left), victim_ids],
    ).fetchall()
    assert {r[0] for r in rows} == left
    worst = max((started - killed_at).total_seconds() for _, started in rows)
    assert worst <= lease + reaper + 1.5, worst
    for daemon in others:
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(20) == 0


def test_sigterm_lets_short_runs_finish(cluster: Cluster, store: Runs, conn: Connection) -> None:
    """Must show 3, first half: runs that finish inside the grace all succeed; exit 0."""
    daemon = cluster.start(cluster.config(grace="10s"))
    store.enqueue_many([NewRun("polite", {"seconds": 1.0}) for _ in range(8)])
    wait_for(lambda: len(cluster.executions()) == 8, 10, what="all started")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(15) == 0
    assert status_counts(conn) == {"succeeded": 8}
    assert len(cluster.executions("done")) == 8
    assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)


def test_sigterm_past_grace_releases_runs_for_another_daemon(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 3, second half: stubborn handlers past the grace -> exit 0 within grace + 5 s,
    runs queued with attempts unchanged and an attempt row 'released'; another daemon
    completes them."""
    grace = 2.0
    daemon = cluster.start(cluster.config(grace="2s"))
    ids = store.enqueue_many([NewRun("stubborn", {"seconds": 30}) for _ in range(3)])
    wait_for(lambda: len(cluster.executions()) == 3, 10, what="all started")
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(grace + 10) == 0
    assert time.monotonic() - started <= grace + 5
    rows = conn.execute(
        "SELECT status, attempts, locked_by FROM runs WHERE id = ANY(%s)", [ids]
    ).fetchall()
    assert rows == [("queued", 0, None)] * 3
    outcomes = conn.execute(
        "SELECT run_id, attempt, outcome FROM attempts ORDER BY run_id"
    ).fetchall()
    assert outcomes == [(i, 1, "released") for i in sorted(ids)]
    conn.execute("UPDATE runs SET payload = '{\"seconds\": 0.1}'")
    cluster.start()
    wait_for(lambda: status_counts(conn) == {"succeeded": 3}, 20, what="completed elsewhere")
    assert conn.execute("SELECT DISTINCT attempts FROM runs").fetchall() == [(1,)]


FINISHER = """
[job_types.finisher]
command = ["/bin/sh", "-c", "trap '' TERM; touch '{mark}'; sleep 2.5; exit 0"]
"""


def test_a_command_that_ignores_the_drain_s_sigterm_and_exits_0_succeeds(
    cluster: Cluster, store: Runs, conn: Connection, tmp_path: Path
) -> None:
    """Torture seed 4318, run 2441: a command that ignored the drain's SIGTERM and exited 0
    on its own, within the kill timeout, was taken as interrupted: its run was released and
    ran again. Exit 0 is a success, whoever sent a signal before. The SIGTERM comes once the
    command has started (its mark), not once the run is claimed: a run claimed but not yet
    started is given back by the drain, as it should be (red beside a CPU burner so)."""
    mark = tmp_path / "started"
    daemon = cluster.start(cluster.config(FINISHER.format(mark=mark), grace="500ms"))
    [run_id] = store.enqueue_many([NewRun("finisher", {})])
    wait_for(mark.exists, 10, what="the command started")
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0, daemon.log()
    row = conn.execute("SELECT status, attempts FROM runs WHERE id = %s", [run_id]).fetchone()
    assert row == ("succeeded", 1), row
    outcomes = conn.execute("SELECT attempt, outcome FROM attempts WHERE run_id = %s", [run_id])
    assert outcomes.fetchall() == [(1, "succeeded")]


TRAPPER = """
[job_types.trapper]
command = ["/bin/sh", "-c", "trap '' TERM; sleep 30"]
"""


def test_a_stubborn_python_handler_is_released_only_as_its_process_ends(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Issue 43 (the harness's CI seed 103): a SIGTERMed daemon whose Python handler ignores
    the cancel gave its run back at the end of the grace, then lived on (here: a command that
    ignores SIGTERM keeps it for the kill timeout), and another daemon ran the run beside the
    first copy. The run is given back as the process's last act, due a moment later: the
    second copy starts after the first daemon has exited."""
    draining = cluster.start(cluster.config(TRAPPER, grace="1s"))
    [run_id] = store.enqueue_many([NewRun("stubborn", {"seconds": 30})])
    store.enqueue(NewRun("trapper"))
    wait_for(lambda: cluster.executions()[run_id] == 1, 10, what="the first copy started")
    wait_for(lambda: status_counts(conn).get("running") == 2, 10, what="the command started")
    cluster.start(cluster.config(TRAPPER))
    conn.execute("UPDATE runs SET payload = '{\"seconds\": 0.1}' WHERE id = %s", [run_id])
    draining.signal(signal.SIGTERM)
    assert draining.wait(30) == 0
    exited = time.time()
    wait_for(lambda: cluster.executions()[run_id] == 2, 20, what="the run taken again")
    second = [r["t"] for r in cluster.records() if r["run_id"] == run_id][1]
    assert second > exited - 0.5, f"the second copy started {exited - second:.1f}s before"
    assert '"released_at_exit"' in draining.log()
    wait_for(lambda: status_counts(conn).get("succeeded") == 1, 20, what="the run done")


def test_second_sigterm_skips_the_grace(cluster: Cluster, store: Runs) -> None:
    daemon = cluster.start(cluster.config(grace="60s"))
    store.enqueue(NewRun("polite", {"seconds": 60}))
    wait_for(lambda: len(cluster.executions()) == 1, 10, what="started")
    daemon.signal(signal.SIGTERM)
    wait_for(lambda: '"draining"' in daemon.log(), 10, what="the first SIGTERM's drain")
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(15) == 0
    assert time.monotonic() - started < 6


COMMANDS = """
[job_types.ok]
command = [
  "/bin/sh", "-c",
  "read p; test \\"$p\\" = '{{\\"a\\":1}}' && test \\"$PGTICK_PAYLOAD\\" = \\"$p\\"",
]

[job_types.bad]
command = [
  "/bin/sh", "-c", "echo noise; echo 'first line' >&2; echo 'disk full on /data' >&2; exit 3",
]
max_attempts = 1

[job_types.hang]
command = ["/bin/sh", "-c", "sleep 1000 & echo $! > {pidfile}; sleep 1000"]
timeout = "1s"
max_attempts = 1
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # a zombie no one reaped is gone
    except FileNotFoundError:
        return True


def test_command_handlers_exit_codes_stderr_and_timeout_kill_the_group(
    cluster: Cluster, store: Runs, tmp_path: Path
) -> None:
    """Must show 5."""
    pidfile = tmp_path / "grandchild.pid"
    cluster.start(cluster.config(COMMANDS.format(pidfile=pidfile)))
    ok = store.enqueue(NewRun("ok", {"a": 1}))
    bad = store.enqueue(NewRun("bad"))
    hang = store.enqueue(NewRun("hang"))

    def finished(run_id: int) -> bool:
        run = store.get_run(run_id)
        return run is not None and run.status in ("succeeded", "dead")

    wait_for(lambda: all(finished(i) for i in (ok, bad, hang)), 20, what="commands finished")
    assert store.get_run(ok).status == "succeeded"  # type: ignore[union-attr]
    bad_run = store.get_run(bad)
    assert bad_run is not None
    assert (bad_run.status, bad_run.error_type) == ("dead", "exit_status")
    assert bad_run.last_error == "exit status 3: disk full on /data"
    assert "first line" in (store.get_attempts(bad)[0].error or "")
    hang_run = store.get_run(hang)
    assert hang_run is not None
    assert (hang_run.status, hang_run.error_type) == ("dead", "timeout")
    grandchild = int(pidfile.read_text())
    wait_for(lambda: _gone(grandchild), 5, what="grandchild killed")


def test_lost_lease_cancels_the_handler_and_drops_its_success(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 6: another daemon takes the run over; the handler, which would succeed on its
    own a few seconds later, sees ctx.cancelled within about one heartbeat; the success it
    still returns is dropped by this daemon (not merely refused by the database), the loss is
    logged and counted once, and the run stays the thief's."""
    heartbeat, own_seconds = 1.0, 8.0
    daemon, base = start_with_metrics(cluster, heartbeat="1s", lease="30s")
    run_id = store.enqueue(NewRun("yielding", {"seconds": own_seconds}))
    wait_for(lambda: cluster.executions().get(run_id), 10, what="started")
    # What another daemon's claim leaves behind: its id and a fresh lease.
    conn.execute(
        "UPDATE runs SET locked_by = 'thief', locked_until = now() + interval '60 seconds' "
        "WHERE id = %s",
        [run_id],
    )
    taken = time.time()
    [cancelled] = wait_for(
        lambda: [r for r in cluster.records() if r["event"] == "cancelled"],
        heartbeat + 4,
        what="handler saw the cancellation",
    )
    assert cancelled["t"] - taken <= heartbeat + LOST_LEASE_SLACK_SECONDS

    def counted() -> bool:
        samples = scrape(base)
        return (
            sample(samples, "pgtick_leases_lost_total", job_type="yielding") == 1
            and sample(samples, "pgtick_run_attempts_total", job_type="yielding", outcome="lost")
            == 1
        )

    # The handler returned (its attempt is counted as lost); then nothing runs any more once
    # the daemon has drained, so whatever it would have written has been written by then.
    wait_for(counted, 10, what="the lost attempt counted")
    samples = scrape(base)
    assert (
        sample(samples, "pgtick_run_attempts_total", job_type="yielding", outcome="succeeded") == 0
    )
    daemon.signal(signal.SIGTERM)
    assert daemon.wait(20) == 0
    events = daemon.events()
    drained = [e for e in events if e.get("event") == "drained"]  # one per worker process
    assert drained
    assert all((d["finished"], d["released"], d["left_running"]) == (0, 0, 0) for d in drained)
    lost = [e for e in events if e.get("event") == "lease_lost"]
    assert [(e["run_id"], e["level"], e.get("at")) for e in lost] == [(run_id, "warning", None)]

    assert [r["event"] for r in cluster.records()] == ["run", "cancelled"]  # never "done"
    run = store.get_run(run_id)
    assert run is not None
    assert (run.status, run.locked_by, run.finished_at) == ("running", "thief", None)
    assert [a.outcome for a in store.get_attempts(run_id)] == [None]


def test_sd_notify_ready_watchdog_status_stopping(
    cluster: Cluster, store: Runs, tmp_path: Path
) -> None:
    """Must show 7."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(10)
    try:
        daemon = cluster.start(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"}, wait=False)
        messages: list[str] = []

        def receive_until(needle: str) -> None:
            while not any(needle in m for m in messages):
                messages.append(sock.recv(4096).decode())

        receive_until("READY=1")
        ready_at = time.monotonic()
        receive_until("WATCHDOG=1")
        count = sum("WATCHDOG=1" in m for m in messages)
        while time.monotonic() - ready_at < 2.2:
            messages.append(sock.recv(4096).decode())
        assert sum("WATCHDOG=1" in m for m in messages) >= count + 3  # every 0.5 s
        assert any(m.startswith("STATUS=") or "\nSTATUS=" in m for m in messages)
        daemon.signal(signal.SIGTERM)
        receive_until("STOPPING=1")
        assert daemon.wait(10) == 0
    finally:
        sock.close()


@pytest.mark.timeout(60)
def test_effect_once_is_true_exactly_once_under_concurrency(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 8, first half."""
    cluster.start()
    cluster.start()
    store.enqueue_many([NewRun("effect", {"key": f"k{i % 5}"}) for i in range(200)])
    wait_for(lambda: status_counts(conn) == {"succeeded": 200}, 30, what="all succeeded")
    firsts = [r for r in cluster.records() if r["event"] == "effect" and r["first"]]
    assert len(firsts) == 5
    assert conn.execute("SELECT count(*) FROM effects").fetchone() == (5,)


def test_transaction_is_atomic_with_success(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    """Must show 8, second half: write then fail leaves no write and no success; write then
    return commits both."""
    conn.execute("CREATE TABLE public.side_effects (run_id bigint)")
    cluster.start()
    failing = store.enqueue(NewRun("tx_fail", {"fail": True}, max_attempts=1))
    passing = store.enqueue(NewRun("tx_fail", {"fail": False}))
    wait_for(
        lambda: (
            {store.get_run(failing).status, store.get_run(passing).status}  # type: ignore[union-attr]
            == {"dead", "succeeded"}
        ),
        15,
        what="both finished",
    )
    assert store.get_run(failing).status == "dead"  # type: ignore[union-attr]
    written = [r[0] for r in conn.execute("SELECT run_id FROM public.side_effects")]
    assert written == [passing]
    assert [a.outcome for a in store.get_attempts(passing)] == ["succeeded"]


@pytest.mark.serial  # a 50 ms bar: run alone (docs/development.md)
def test_pickup_with_idle_workers_is_fast(cluster: Cluster, store: Runs, conn: Connection) -> None:
    """Must show 9: enqueue -> handler start, median of 20, under 50 ms (poll interval 5 s)."""
    cluster.start()
    # Idle means listening: the LISTEN connection is up (NOTIFYs before it would be lost).
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'pgtick-listener' AND query LIKE 'LISTEN%'"
            ).fetchone()
            == (1,)
        ),
        10,
        what="the daemon listening",
    )
    delays = []
    for _ in range(20):
        run_id = store.enqueue(NewRun("pickup"))
        created = conn.execute(
            "SELECT extract(epoch FROM created_at) FROM runs WHERE id = %s", [run_id]
        ).fetchone()[0]  # type: ignore[index]
        record = wait_for(
            lambda rid=run_id: [r for r in cluster.records() if r["run_id"] == rid], 5
        )
        delays.append(record[0]["t"] - float(created))
        # Idle again before the next one: this run's success is written.
        wait_for(lambda rid=run_id: store.get_run(rid).status == "succeeded", 5)  # type: ignore[union-attr]
    assert statistics.median(delays) < 0.050, delays


def test_run_refuses_an_outdated_schema_unless_migrate(cluster: Cluster, empty_dsn: str) -> None:
    cluster.dsn = empty_dsn
    daemon = cluster.start(wait=False)
    assert daemon.wait(20) == 2
    assert "pgtick migrate" in daemon.log()
    assert "Traceback" not in daemon.log()
    migrated = cluster.start(args=("--migrate",))
    migrated.signal(signal.SIGTERM)
    assert migrated.wait(20) == 0


def test_unknown_job_types_wait_instead_of_failing(
    cluster: Cluster, store: Runs, conn: Connection
) -> None:
    cluster.start()
    other = store.enqueue(NewRun("nobody_handles_this"))
    mine = store.enqueue(NewRun("record"))
    wait_for(lambda: store.get_run(mine).status == "succeeded", 10)  # type: ignore[union-attr]
    assert store.get_run(other).status == "queued"  # type: ignore[union-attr]


def test_a_second_sigterm_as_the_daemon_ends_does_not_turn_its_exit_0_into_a_signal(
    cluster: Cluster,
) -> None:
    """Torture seed 4318 (d1#16): a second SIGTERM came once the daemon had stopped and
    restored the default handlers, while its pools closed: the process died of it (-15)
    instead of exiting 0. A default action is now ignore from then on."""
    daemon = cluster.start(cluster.config(processes=2))
    daemon.signal(signal.SIGTERM)
    wait_for(lambda: '"daemon_stopped"' in daemon.log(), 20, interval=0.005, what="stopped")
    for _ in range(20):
        if daemon.proc.poll() is not None:
            break
        daemon.signal(signal.SIGTERM)
        time.sleep(0.01)
    assert daemon.wait(20) == 0, daemon.log()
