"""Results (issue 48, docs/composition.md): a handler's return value stored with its attempt,
bounded (1 MiB) with a clear error, the same value in `pgtick show`, `--json`, the console's
run page, pgtick.result() and the SQL function, and gone with its run when pruned."""

from __future__ import annotations

import json
from pathlib import Path

import pgtick
from tests.dbhelp import Connection

from .cli import pgtick as cli
from .conftest import Cluster, wait_for

JOB_TYPES = """
[job_types.give]
handler = "compose_jobs:give"
max_attempts = 1

[job_types.tx]
handler = "compose_jobs:in_transaction"

[job_types.cmd]
command = ["sh", "-c", "echo progress; echo '{\\"rows\\": 42}'"]
result_from_stdout = true

[job_types.cmd_bad]
command = ["sh", "-c", "echo not json"]
result_from_stdout = true
max_attempts = 1

[retention]
succeeded = "1s"
"""


def _status(conn: Connection, run_id: int) -> str:
    return str(conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()[0])


def _ended(conn: Connection, *ids: int) -> bool:
    rows = conn.execute(
        "SELECT count(*) FROM runs WHERE id = ANY(%s) AND status IN ('succeeded', 'dead')",
        (list(ids),),
    ).fetchone()
    return bool(rows[0] == len(ids))


def test_results_stored_bounded_shown_alike_and_pruned(
    cluster: Cluster, conn: Connection, dsn: str, tmp_path: Path
) -> None:
    value = {"total": 12.5, "items": ["a", "é"], "ok": True, "none": None}
    ok = pgtick.enqueue(conn, "give", {"give": value})
    at_bound = pgtick.enqueue(conn, "give", {"bytes": 1024 * 1024 - 2})  # "xx…": 1 MiB exactly
    too_big = pgtick.enqueue(conn, "give", {"bytes": 1024 * 1024 + 10})
    tx = pgtick.enqueue(conn, "tx")
    cmd = pgtick.enqueue(conn, "cmd")
    cmd_bad = pgtick.enqueue(conn, "cmd_bad")
    nothing = pgtick.enqueue(conn, "give", {})
    cluster.start(cluster.config(JOB_TYPES))
    wait_for(lambda: _ended(conn, ok, at_bound, too_big, tx, cmd, cmd_bad, nothing), 60)

    # The bound: past it, the attempt fails with one clear line; at it, stored whole.
    assert _status(conn, too_big) == "dead"
    last_error = conn.execute("SELECT last_error FROM runs WHERE id = %s", (too_big,)).fetchone()
    assert last_error[0] == (
        "result: 1.0 MiB of JSON is over the bound of 1.0 MiB "
        "(store large results elsewhere and return a reference)"
    )
    assert _status(conn, at_bound) == "succeeded"
    assert len(pgtick.result(conn, at_bound)) == 1024 * 1024 - 2

    # The same value through every reader.
    assert pgtick.result(conn, ok) == value
    sql_value = conn.execute("SELECT pgtick.result(%s)", (ok,)).fetchone()[0]
    assert sql_value == value
    shown = cli(dsn, "show", str(ok), "--json")
    assert shown.code == 0, shown.err
    detail = json.loads(shown.text)
    assert detail["result"] == value
    assert detail["attempt_history"][0]["result"] == value
    text = cli(dsn, "show", str(ok))
    [line] = [line for line in text.out if line.startswith("  result:")]
    assert json.loads(line.split(":", 1)[1]) == value
    assert pgtick.wait(conn, ok, timeout=5) == ("succeeded", value)

    assert pgtick.result(conn, tx) == {"in": "transaction"}
    assert pgtick.result(conn, cmd) == {"rows": 42}
    assert _status(conn, cmd_bad) == "dead"
    bad_error = conn.execute("SELECT last_error FROM runs WHERE id = %s", (cmd_bad,)).fetchone()
    assert bad_error[0].startswith("result: the last line of stdout is not JSON")
    assert pgtick.result(conn, nothing) is None
    assert "result" not in "\n".join(cli(dsn, "show", str(nothing)).out)

    # Pruned with the run: the attempt (and its result) goes with its partition or rows.
    pruned = cli(dsn, "prune", "--older-than", "1s", "--status", "succeeded")
    wait_for(
        lambda: (
            cli(dsn, "prune", "--older-than", "1s", "--status", "succeeded").code == 0
            and not conn.execute("SELECT 1 FROM runs WHERE id = %s", (ok,)).fetchone()
        ),
        30,
        interval=1.0,
        what="the succeeded runs pruned",
    )
    assert pruned.code == 0, pruned.err
    assert pgtick.result(conn, ok) is None
    left = conn.execute(
        "SELECT count(*) FROM attempts WHERE run_id = ANY(%s) AND result IS NOT NULL",
        ([ok, at_bound, tx, cmd],),
    ).fetchone()
    assert left[0] == 0
