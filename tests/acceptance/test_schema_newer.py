"""A daemon whose version predates a stop-daemons migration applied to its database refuses to
start, with one line naming the migration (exit 2), rather than claim and finish by rules the
tables no longer follow (a daemon from before 0013, started after it, claimed nothing and
logged claim_failed); a newer migration that daemons may run across does not stop it. The
future migration is a row in schema_migrations, as a newer pgtick's migrate leaves it."""

from __future__ import annotations

from pathlib import Path

from tests.dbhelp import Connection

from .cli import pgtick

CONFIG = """
[job_types.noop]
command = ["/bin/true"]

[metrics]
listen = ""
"""
FUTURE = (
    "INSERT INTO schema_migrations (version, name, sha256, stops_daemons)"
    " VALUES ('9999', 'future_storage', repeat('f', 64), %s)"
)


def test_run_and_check_refuse_a_schema_newer_by_a_stop_daemons_migration(
    conn: Connection, dsn: str, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    conn.execute(FUTURE, [True])
    conn.execute("SELECT enqueue('noop')")
    for argv in (("check", "--db"), ("run",)):
        result = pgtick(dsn, *argv, "--config", str(config))
        assert result.code == 2, (argv, result.err)
        assert "9999_future_storage" in result.error
        assert "install the pgtick that brought it" in result.error
    row = conn.execute("SELECT status, attempts FROM runs").fetchone()
    assert row == ("queued", 0)  # nothing claimed
    workers = conn.execute("SELECT count(*) FROM workers").fetchone()
    assert workers == (0,)  # and no daemon registered

    conn.execute("UPDATE schema_migrations SET stops_daemons = false WHERE version = '9999'")
    result = pgtick(dsn, "check", "--db", "--config", str(config))
    assert result.code == 0, result.err
