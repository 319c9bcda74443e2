"""`pgtick retry` and `pgtick cancel` as subprocesses: exactly the documented states are
accepted, others exit 2 naming the run's status, unknown ids exit 4, and a refused command
changes nothing; bulk forms need --yes above 100 runs when stdin is not a terminal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.dbhelp import STATUSES, Connection

from .cli import checksum, insert_run, pgtick

ACCEPTS = {
    "retry": ("failed", "dead", "cancelled"),
    "cancel": ("queued", "running", "failed"),
}
AFTER = {"retry": "queued", "cancel": "cancelled"}


def _run_in(conn: Connection, status: str, job_type: str = "email") -> int:
    extra: dict[str, object] = {}
    if status == "running":
        extra = {"locked_by": "w", "locked_until": "2099-01-01T00:00:00Z", "attempts": 1}
    if status in ("succeeded", "dead", "cancelled", "skipped"):
        extra = {"finished_at": "now()", "attempts": 1, "max_attempts": 1}
    return insert_run(conn, job_type=job_type, status=status, **extra)


def _status_of(conn: Connection, run_id: int) -> str:
    row = conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("verb", ["retry", "cancel"])
def test_state_rules_by_id(conn: Connection, dsn: str, verb: str) -> None:
    runs = {status: _run_in(conn, status) for status in STATUSES}
    for status, run_id in runs.items():
        before = checksum(conn)
        result = pgtick(dsn, verb, str(run_id))
        if status in ACCEPTS[verb]:
            assert result.code == 0, (status, result)
            assert result.out == [
                f"{'retried' if verb == 'retry' else 'cancelled'} 1 run(s): {run_id}"
            ]
            assert _status_of(conn, run_id) == AFTER[verb]
        else:
            assert result.code == 2, (status, result)
            assert f"cannot {verb} run {run_id}: it is {status}" in result.error
            assert checksum(conn) == before


@pytest.mark.parametrize("verb", ["retry", "cancel"])
def test_unknown_ids_and_mixed_requests_change_nothing(
    conn: Connection, dsn: str, verb: str
) -> None:
    ok = _run_in(conn, ACCEPTS[verb][0])
    wrong = _run_in(conn, "succeeded")
    before = checksum(conn)
    missing = pgtick(dsn, verb, str(ok), "999999")
    assert missing.code == 4 and missing.error == "pgtick: run 999999 not found"
    mixed = pgtick(dsn, verb, str(ok), str(wrong))
    assert mixed.code == 2 and f"run {wrong}: it is succeeded" in mixed.error
    for bad in (["-5"], ["abc"], []):
        result = pgtick(dsn, verb, *bad)
        assert result.code == 2, (bad, result)
        assert result.error.startswith("pgtick")
    both = pgtick(dsn, verb, str(ok), "--status", ACCEPTS[verb][0], "--type", "email")
    assert both.code == 2 and "not both" in both.error
    assert checksum(conn) == before


def test_bulk_retry_and_cancel_need_yes_above_100(conn: Connection, dsn: str) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        " SELECT 'email', 'dead', 3, 3, now() FROM generate_series(1, 150)"
    )
    others = [_run_in(conn, "dead", "other") for _ in range(5)]
    old = insert_run(
        conn,
        job_type="other",
        status="dead",
        attempts=1,
        max_attempts=1,
        finished_at="2020-01-01T00:00:00Z",
    )

    before = checksum(conn)
    refused = pgtick(dsn, "retry", "--status", "dead", "--type", "email")
    assert refused.code == 2
    assert "150 runs match" in refused.error and "--yes" in refused.error
    wrong_state = pgtick(dsn, "retry", "--status", "queued", "--type", "email", "--yes")
    assert wrong_state.code == 2 and "'queued'" in wrong_state.error
    no_type = pgtick(dsn, "retry", "--status", "dead")
    assert no_type.code == 2
    assert checksum(conn) == before

    done = pgtick(dsn, "retry", "--status", "dead", "--type", "email", "--yes")
    assert done.code == 0, done.err
    assert done.out == ["retried 150 run(s) (dead email)"]
    counts = dict(
        conn.execute("SELECT job_type || ':' || status, count(*) FROM runs GROUP BY 1").fetchall()
    )
    assert counts == {"email:queued": 150, "other:dead": 6}

    # At or below the threshold no --yes is needed; --since keeps the old one out.
    recent = pgtick(dsn, "retry", "--status", "dead", "--type", "other", "--since", "1h")
    assert (recent.code, recent.out) == (0, ["retried 5 run(s) (dead other)"])
    assert {_status_of(conn, i) for i in others} == {"queued"}
    assert _status_of(conn, old) == "dead"

    refused = pgtick(dsn, "cancel", "--type", "email", "--status", "queued")
    assert refused.code == 2 and "150 runs match" in refused.error
    done = pgtick(dsn, "cancel", "--type", "email", "--status", "queued", "--yes")
    assert (done.code, done.out) == (0, ["cancelled 150 run(s) (queued email)"])
    row = conn.execute("SELECT count(*) FROM runs WHERE status = 'cancelled'").fetchone()
    assert row == (150,)


def _on_a_terminal(dsn: str, answer: str, *argv: str) -> tuple[int, str]:
    """`pgtick ARGV` with stdin a pseudo-terminal on which ``answer`` is typed."""
    main, tty = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgtick", *argv],
            stdin=tty,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PGTICK_DSN": dsn, "PGTICK_CONFIG": ""},
        )
        os.write(main, answer.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(tty)
        os.close(main)
    return proc.returncode, out


def test_bulk_change_asks_on_a_terminal(conn: Connection, dsn: str) -> None:
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, max_attempts, finished_at)"
        " SELECT 'email', 'dead', 1, 1, now() FROM generate_series(1, 101)"
    )
    before = checksum(conn)
    code, out = _on_a_terminal(dsn, "n", "retry", "--status", "dead", "--type", "email")
    assert code == 0, out
    assert "retry 101 dead runs of email? [y/N]" in out and "nothing retried" in out
    assert checksum(conn) == before
    code, out = _on_a_terminal(dsn, "y", "retry", "--status", "dead", "--type", "email")
    assert code == 0, out
    assert out.rstrip().endswith("? [y/N] retried 101 run(s) (dead email)"), out
    assert conn.execute("SELECT count(*) FROM runs WHERE status = 'queued'").fetchone() == (101,)
