"""Running `pgtick` operator verbs as subprocesses and seeding runs with plain SQL."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from tests.dbhelp import Connection

CLI_TIMEOUT_SECONDS = 60.0
TERMINAL_COLUMNS = 100


@dataclass(frozen=True)
class Result:
    code: int
    out: list[str]
    err: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.out)

    @property
    def error(self) -> str:
        """The one stderr line an error must produce, and no traceback anywhere."""
        assert len(self.err) == 1, self.err
        assert "Traceback" not in "\n".join(self.out + self.err)
        return self.err[0]


def pgtick(dsn: str, *argv: str, stdin: str = "", env: dict[str, str] | None = None) -> Result:
    """`pgtick ARGV` with stdin a pipe (not a TTY) and a 100-column terminal."""
    proc = subprocess.run(
        [sys.executable, "-m", "pgtick", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        env={
            **os.environ,
            "PGTICK_DSN": dsn,
            "COLUMNS": str(TERMINAL_COLUMNS),
            "PGTICK_CONFIG": "",
            **(env or {}),
        },
    )
    err = [line for line in proc.stderr.splitlines() if line]
    return Result(proc.returncode, proc.stdout.splitlines(), err)


def insert_run(conn: Connection, **columns: Any) -> int:
    """One runs row with the given columns (SQL expressions allowed via ``sql_`` prefix)."""
    names = list(columns)
    values = [columns[n] for n in names]
    placeholders = ", ".join(["%s"] * len(names))
    row = conn.execute(
        f"INSERT INTO runs ({', '.join(names)}) VALUES ({placeholders}) RETURNING id",
        values,
    ).fetchone()
    assert row is not None
    return int(row[0])


def checksum(conn: Connection) -> tuple[Any, ...]:
    """Row counts and a digest of every pgtick table: a refused command changes none of them."""
    out = []
    for table in ("runs", "attempts", "schedules", "workers", "effects"):
        row = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM {table} t"
        ).fetchone()
        out.append((table, row))
    return tuple(out)
