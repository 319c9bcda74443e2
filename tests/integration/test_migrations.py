"""Must show 6: migrations are idempotent, refuse edited files, and the indexes serve."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import pytest

from pgtick.cli.exits import EXIT_USAGE, exit_code
from pgtick.errors import MigrationError, SchemaNewerError, SchemaOutdatedError
from pgtick.storage import db, migrate, sqlfile
from tests import dbhelp
from tests.integration import plans

TERMINAL_SCAN = re.compile(r"Scan on runs_(succeeded|dead|cancelled|skipped)")
EXPECTED_TABLES = {
    "batches",
    "schedules",
    "runs",
    "attempts_history",
    "workers",
    "rate_starts",
    "job_type_settings",
    "effects",
    "schema_migrations",
    "terminal_run_counts",
    "terminal_run_counts_refresh",
    "output_chunks",
    "partitions",
    "run_keys",
    "partitioned_tables",
    "console_logouts",
    "job_type_controls",
    "audit_log",
    "rollup_minutes",
    "rollup_hours",
}


def test_apply_twice_is_a_no_op(empty_dsn: str) -> None:
    first = migrate.migrate(empty_dsn, "pgtick")
    assert first == [f"{m.version}_{m.name}" for m in migrate.available()]
    assert migrate.migrate(empty_dsn, "pgtick") == []
    with dbhelp.connect(empty_dsn, "pgtick") as conn:
        tables = {  # partitions aside
            r[0]
            for r in conn.execute(
                "SELECT c.relname::text FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'pgtick' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            )
        }
        assert tables == EXPECTED_TABLES
        views = conn.execute(
            "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'pgtick' AND c.relkind = 'v'"
        ).fetchall()
        assert views == [("attempts",)]  # ended attempts and the open ones, read from runs
        migrate.check_current(conn, "pgtick")


def test_custom_schema_is_self_contained(empty_dsn: str) -> None:
    migrate.migrate(empty_dsn, "jobs_2")
    with db.connect_raw(empty_dsn) as conn:
        # The SQL function finds its tables whatever the caller's search_path is.
        row = conn.execute("SELECT jobs_2.enqueue('x')").fetchone()
        assert row is not None
        count = conn.execute("SELECT count(*) FROM jobs_2.runs").fetchone()
        assert count == (1,)
        missing = conn.execute("SELECT to_regclass('pgtick.runs')").fetchone()
        assert missing == (None,)


def test_outdated_schema_is_refused_with_the_command_to_run(empty_dsn: str) -> None:
    with (
        dbhelp.connect(empty_dsn, "pgtick") as conn,
        pytest.raises(SchemaOutdatedError, match="pgtick migrate"),
    ):
        migrate.check_current(conn, "pgtick")


def test_modified_applied_file_is_refused(empty_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate.migrate(empty_dsn, "pgtick")
    original = migrate.available()
    edited = [
        migrate.Migration(m.version, m.name, m.sql + "\n-- edited\n", "0" * 64) for m in original
    ]
    monkeypatch.setattr(migrate, "available", lambda: edited)
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate.migrate(empty_dsn, "pgtick")
    with dbhelp.connect(empty_dsn, "pgtick") as conn, pytest.raises(MigrationError):
        migrate.check_current(conn, "pgtick")


def test_a_database_that_applied_a_revised_file_s_earlier_text_is_current(
    empty_dsn: str,
) -> None:
    """0010 gained a prelude after its release: an install that applied the earlier text (its
    sha256 recorded) is where the revised text leaves it, neither pending nor changed; any
    other text is still refused."""
    migrate.migrate(empty_dsn, "pgtick")
    (earlier,) = migrate.EARLIER_TEXTS["0010"]
    with dbhelp.connect(empty_dsn, "pgtick") as conn:
        conn.execute("UPDATE schema_migrations SET sha256 = %s WHERE version = '0010'", (earlier,))
        migrate.check_current(conn, "pgtick")
        assert migrate.pending(conn, "pgtick") == []
        conn.execute("UPDATE schema_migrations SET sha256 = %s WHERE version = '0010'", ("1" * 64,))
        with pytest.raises(MigrationError, match="changed after it was applied"):
            migrate.check_current(conn, "pgtick")


def test_a_prelude_commits_before_the_rest_of_its_file() -> None:
    """The prelude is the part before its marker line; the rest runs in its own transaction."""
    (m,) = [m for m in migrate.available() if m.version == "0010"]
    prelude, rest = m.parts()
    assert prelude is not None and "CREATE OR REPLACE FUNCTION enqueue" in prelude
    assert "ALTER TABLE runs RENAME" not in prelude and "ALTER TABLE runs RENAME" in rest
    assert all(other.parts()[0] is None for other in migrate.available() if other.version != "0010")


def test_concurrent_migrators_apply_once(empty_dsn: str) -> None:
    import threading

    results: list[list[str]] = []

    def run() -> None:
        results.append(migrate.migrate(empty_dsn, "pgtick"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Every migration applied by exactly one of them. Usually one migrator applies them all,
    # but each is applied under the lock on its own, so another may take the next one in the
    # moment between two (CI at 72c67ce: 10 and 1).
    applied = [name for r in results for name in r]
    assert len(results) == 4
    assert sorted(applied) == sorted(f"{m.version}_{m.name}" for m in migrate.available())


def _plan(conn: db.Connection, name: str, params: dict[str, object]) -> str:
    rows = conn.execute(
        b"EXPLAIN " + sqlfile.query(name, "pgtick").as_bytes(None), params
    ).fetchall()
    return plans.readable(conn, "\n".join(r[0] for r in rows))


@pytest.mark.timeout(300)
def test_claim_and_reaper_use_their_partial_indexes(conn: db.Connection) -> None:
    conn.execute(
        """
        INSERT INTO runs (job_type, status, run_at, attempts, max_attempts, finished_at)
        SELECT 'noop', (ARRAY['succeeded','dead','cancelled','skipped'])[1 + g % 4],
               now() - interval '1 day', 1, 10, now() - interval '1 hour'
        FROM generate_series(1, 1000000) g
        """
    )
    conn.execute(
        "INSERT INTO runs (job_type, run_at) "
        "SELECT 'noop', now() - g * interval '1 second' FROM generate_series(1, 1000) g"
    )
    conn.execute(
        "INSERT INTO runs (job_type, status, locked_by, locked_until) "
        "SELECT 'noop', 'running', 'w', now() + interval '1 minute' FROM generate_series(1, 50)"
    )
    conn.execute("ANALYZE runs")
    claim = _plan(
        conn,
        "claim",
        {
            "worker_id": "w",
            "job_types": ["noop"],
            "leases": [60.0],
            "max_attempts": [10],
            "lows": [None],
            "looks": [False],
            "look_froms": [None],
            "limit": 10,
        },
    )
    # The finished runs are in partitions of their own, which neither statement reads; the
    # claim may read the small live partition sequentially to find the rows it locked.
    assert "runs_claim_idx" in claim, claim
    assert not TERMINAL_SCAN.search(claim), claim
    reap = _plan(conn, "reap_select", {"limit": 500, "since": None, "alive": 5.0, "slack": 0.5})
    assert "runs_lease_idx" in reap, reap
    assert "Seq Scan on runs" not in reap, reap


@pytest.mark.timeout(300)
def test_claim_and_next_due_skip_other_job_types_through_the_index(conn: db.Connection) -> None:
    """A fleet split by job type: 200 000 due runs of a type this daemon does not handle must
    not be read by its claims or by its idle next_due poll (bug: ~33 ms a poll)."""
    conn.execute(
        "INSERT INTO runs (job_type, run_at) "
        "SELECT 'other', now() - g * interval '1 second' FROM generate_series(1, 200000) g"
    )
    conn.execute(
        "INSERT INTO runs (job_type, run_at) "
        "SELECT (ARRAY['mine','also_mine'])[1 + g % 2], now() + g * interval '1 minute' "
        "FROM generate_series(1, 20) g"
    )
    conn.execute("ANALYZE runs")
    params: dict[str, object] = {
        "worker_id": "w",
        "job_types": ["mine", "also_mine", "third"],
        "leases": [60.0, 60.0, 60.0],
        "max_attempts": [10, 10, 10],
        "lows": [None, None, None],  # from the start: the rescan, the most a scan can read
        "looks": [False, False, False],
        "look_froms": [None, None, None],
        "limit": 8,
    }
    for name in ("claim", "next_due"):
        plan = _plan(conn, name, params)
        assert "runs_claim_idx" in plan, plan
        assert "Seq Scan on runs" not in plan, plan
        assert "Bitmap Heap Scan on runs" not in plan, plan
        # Measured, not only planned: a handful of pages, not the other type's 200 000 rows.
        # The claim really runs under ANALYZE, so its transaction is rolled back.
        statement = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sqlfile.query(
            name, "pgtick"
        ).as_bytes(None)
        with conn.transaction(force_rollback=True):
            row = conn.execute(statement, params).fetchone()
        assert row is not None
        top = row[0][0]["Plan"]
        pages = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
        assert pages < 200, (name, pages, plan)
    assert conn.execute("SELECT count(*) FROM runs WHERE status = 'running'").fetchone() == (0,)


def test_no_transaction_files_split_into_their_statements() -> None:
    files = [m for m in migrate.available() if not m.transactional]
    assert files, "expected the concurrent index migration"
    statements = files[0].statements()
    assert len(statements) == 5, statements
    assert all("CONCURRENTLY" in s for s in statements[:4]), statements
    assert statements[4].startswith("-- enqueue() refuses") and statements[4].endswith("$$;")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_index_migration_does_not_block_writes_of_running_daemons(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rolling deploy: while migration 0004 waits for an open write transaction to end, other
    sessions (daemons of the previous version) still enqueue and claim. A plain CREATE INDEX
    would queue its SHARE lock behind the open transaction and every new write behind it."""
    files = migrate.available()
    first = next(i for i, m in enumerate(files) if not m.transactional)
    monkeypatch.setattr(migrate, "available", lambda: files[:first])
    migrate.migrate(empty_dsn, "pgtick")
    monkeypatch.setattr(migrate, "available", lambda: files)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate.migrate(empty_dsn, "pgtick")
        except BaseException as exc:
            errors.append(exc)

    with (
        dbhelp.connect(empty_dsn, "pgtick") as holder,
        dbhelp.connect(empty_dsn, "pgtick") as writer,
    ):
        writer.execute("SET lock_timeout = '2s'")
        with holder.transaction():
            holder.execute("SELECT enqueue('before')")
            thread = threading.Thread(target=run)
            thread.start()

            def migrator_waits() -> bool:
                row = writer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                    " 'pgtick-migrate' AND wait_event_type = 'Lock'"
                ).fetchone()
                return row is not None and row[0] > 0

            _wait(migrator_waits, 30, "the migration to wait for the open transaction")
            writer.execute("SELECT enqueue('during')")
            claimed = writer.execute(
                "UPDATE runs SET status = 'running', locked_by = 'old', "
                "locked_until = now() + interval '1 minute' WHERE job_type = 'during' "
                "RETURNING id"
            ).fetchall()
            assert len(claimed) == 1
        thread.join(60)
        assert not thread.is_alive() and not errors, errors
        valid = writer.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid ="
            " i.indexrelid WHERE c.relname IN ('runs_job_type_id_idx', 'effects_run_id_idx')"
            " ORDER BY 1"
        ).fetchall()
        assert valid == [("effects_run_id_idx", True), ("runs_job_type_id_idx", True)]
        migrate.check_current(writer, "pgtick")


STORAGE_CUT_OVER = (
    "-- pgtick: stop-daemons\n"
    "-- Test fixture: a migration daemons of earlier versions cannot run across.\n"
    "CREATE TABLE cut_over_marker (id int);\n"
)


CUT_OVER = migrate.Migration("9999", "cut_over", STORAGE_CUT_OVER, "f" * 64)


def _with_cut_over(monkeypatch: pytest.MonkeyPatch) -> migrate.Migration:
    shipped = migrate.available()
    monkeypatch.setattr(migrate, "available", lambda: [*shipped, CUT_OVER])
    return CUT_OVER


def _register(dsn: str, worker_id: str, pid: int, heartbeat_age_seconds: float) -> None:
    with dbhelp.connect(dsn, "pgtick") as conn:
        conn.execute(
            "INSERT INTO workers (id, hostname, pid, version, threads, job_types, heartbeat_at) "
            "VALUES (%s, 'vm-1', %s, '0.9.0', 8, '{noop}', "
            "now() - make_interval(secs => %s))",
            [worker_id, pid, heartbeat_age_seconds],
        )


def _cut_over_applied(dsn: str) -> bool:
    with dbhelp.connect(dsn, "pgtick") as conn:
        row = conn.execute("SELECT to_regclass('pgtick.cut_over_marker') IS NOT NULL").fetchone()
        recorded = conn.execute(
            "SELECT count(*) FROM schema_migrations WHERE version = '9999'"
        ).fetchone()
    assert row is not None and recorded is not None
    assert row[0] == (recorded[0] == 1)  # the file and its record commit together
    return bool(row[0])


def test_a_stop_daemons_migration_is_marked_only_in_its_leading_comments() -> None:
    def stops(text: str) -> bool:
        return migrate.Migration("0001", "x", text, "0" * 64).stops_daemons

    assert stops(STORAGE_CUT_OVER)
    assert stops("-- pgtick: no-transaction\n-- pgtick: stop-daemons\nCREATE INDEX i ON t (a);")
    assert not stops("CREATE TABLE t (a int);\n-- pgtick: stop-daemons\n")
    # The storage cut-over and the attempts written once, the only ones shipped.
    assert [m.name for m in migrate.available() if m.stops_daemons] == [
        "partition_runs",
        "write_each_attempt_once",
    ]


def test_a_stop_daemons_migration_is_refused_while_a_daemon_heartbeats(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.migrate(empty_dsn, "pgtick")
    _register(empty_dsn, "old-1", 4242, heartbeat_age_seconds=3)
    _register(empty_dsn, "killed-long-ago", 17, heartbeat_age_seconds=3600)
    _with_cut_over(monkeypatch)
    with pytest.raises(MigrationError) as refused:
        migrate.migrate(empty_dsn, "pgtick")
    message = str(refused.value)
    assert "9999_cut_over" in message and "1 daemon(s)" in message
    assert "vm-1:4242 (pgtick 0.9.0, 3 s ago)" in message and ":17 " not in message
    assert "--force" in message and "\n" not in message
    assert not _cut_over_applied(empty_dsn)
    with dbhelp.connect(empty_dsn, "pgtick") as conn:
        # The daemon that was alive stopped (a clean exit deregisters it): now it applies.
        conn.execute("DELETE FROM workers WHERE id = 'old-1'")
    assert migrate.migrate(empty_dsn, "pgtick") == ["9999_cut_over"]
    assert _cut_over_applied(empty_dsn)


def test_force_applies_a_stop_daemons_migration_while_a_daemon_heartbeats(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.migrate(empty_dsn, "pgtick")
    _register(empty_dsn, "old-1", 4242, heartbeat_age_seconds=1)
    _with_cut_over(monkeypatch)
    assert migrate.migrate(empty_dsn, "pgtick", force=True) == ["9999_cut_over"]
    assert _cut_over_applied(empty_dsn)


def test_a_fresh_install_applies_a_stop_daemons_migration_with_the_rest(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_over = _with_cut_over(monkeypatch)
    applied = migrate.migrate(empty_dsn, "pgtick")
    assert applied[-1] == f"{cut_over.version}_{cut_over.name}"
    assert _cut_over_applied(empty_dsn)


def test_the_stop_daemons_migrations_are_recorded_as_such(empty_dsn: str) -> None:
    """0014 marks the two before it; migrate marks each later one as it records it."""
    migrate.migrate(empty_dsn, "pgtick")
    with dbhelp.connect(empty_dsn, "pgtick") as conn:
        marked = conn.execute("SELECT version FROM schema_migrations WHERE stops_daemons")
        assert [v for (v,) in marked] == [m.version for m in migrate.available() if m.stops_daemons]


def test_a_daemon_refuses_a_schema_newer_by_a_stop_daemons_migration_it_does_not_know(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What an old daemon met after 0013 (it claimed nothing and logged claim_failed) is, from
    here on, a refusal to start naming the migration; a newer migration that daemons may run
    across (an index, a function) is no reason to refuse."""
    shipped = migrate.available()
    later = migrate.Migration("9998", "an_index", "CREATE INDEX ON schedules (name);\n", "e" * 64)
    monkeypatch.setattr(migrate, "available", lambda: [*shipped, later, CUT_OVER])
    assert migrate.migrate(empty_dsn, "pgtick")[-2:] == ["9998_an_index", "9999_cut_over"]
    with dbhelp.connect(empty_dsn, "pgtick") as conn:
        migrate.check_current(conn, "pgtick")  # the code that brought them
        monkeypatch.setattr(migrate, "available", lambda: [*shipped, later])
        with pytest.raises(SchemaNewerError) as refused:
            migrate.check_current(conn, "pgtick")  # a daemon of the version before
        message = str(refused.value)
        assert "9999_cut_over" in message and "9998" not in message and "\n" not in message
        assert "install the pgtick that brought it" in message
        assert exit_code(refused.value) == EXIT_USAGE
        monkeypatch.setattr(migrate, "available", lambda: shipped)
        with pytest.raises(SchemaNewerError):  # and one of two versions before
            migrate.check_current(conn, "pgtick")
        conn.execute("UPDATE schema_migrations SET stops_daemons = false WHERE version = '9999'")
        migrate.check_current(conn, "pgtick")  # only the marked ones are refused
