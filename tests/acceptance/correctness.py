"""Helpers of the correctness tests: enqueueing through the SQL function and reading what the
database says happened."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from tests import dbhelp

# A daemon that handles no job type: it claims nothing, but its reaper recovers expired leases.
REAPER_ONLY_CONFIG = """
[worker]
threads = 1
processes = 1

[ticker]
reaper_interval = "{reaper}"

[metrics]
listen = ""

[logging]
format = "json"
"""


def enqueue(
    conn: dbhelp.Connection,
    items: Sequence[tuple[str, dict[str, Any]]],
    *,
    max_attempts: int | None = None,
) -> list[int]:
    """Runs of (job type, payload), due now, in one statement through ``pgtick.enqueue()``:
    they are claimed in the order given. Returns their ids in that order."""
    rows = conn.execute(
        "SELECT enqueue(t.job_type, t.payload, NULL, NULL, %s) "
        "FROM unnest(%s::text[], %s::jsonb[]) WITH ORDINALITY AS t(job_type, payload, ord) "
        "ORDER BY t.ord",
        [max_attempts, [t for t, _ in items], [Jsonb(p) for _, p in items]],
    ).fetchall()
    ids = [int(r[0]) for r in rows]
    assert ids == sorted(ids)
    return ids


def statuses(conn: dbhelp.Connection) -> dict[int, str]:
    return {int(i): str(s) for i, s in conn.execute("SELECT id, status FROM runs").fetchall()}


def count(conn: dbhelp.Connection, where: str, params: Sequence[Any] = ()) -> int:
    row = conn.execute(f"SELECT count(*) FROM runs WHERE {where}", params).fetchone()
    assert row is not None
    return int(row[0])


def reaper_only_config(tmp_path: Path, reaper: str = "500ms") -> Path:
    path = tmp_path / f"reaper-only-{reaper}.toml"
    path.write_text(REAPER_ONLY_CONFIG.format(reaper=reaper))
    return path
