"""Query plans as the tests read them, on partitioned tables (migration 0010): a partition's
index is named by the partitioned index it belongs to (``runs_live_job_type_priority_..._idx``
reads as ``runs_claim_idx``), and the scans of partitions that hold few rows are left out (the
planner reads a small table sequentially, which costs a few pages and says nothing about the
statement's cost on a large one). Also how the tests PREPARE one of pgtick's statements (its
``%(name)s`` parameters numbered), and a parameter set for each statement of the hot path."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from pgtick.storage import db

_SCANNED = re.compile(r" on (\w+)")
_PARAM = re.compile(r"%\((\w+)\)s")
# A partition with fewer rows is read sequentially when the planner likes (a few pages).
SMALL_ROWS = 1000


def readable(conn: db.Connection, plan: str) -> str:
    """``plan`` (EXPLAIN's text) as described above."""
    roots = dict(
        conn.execute(
            "SELECT c.relname::text, r.relname::text FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_class r ON r.oid = pg_partition_root(c.oid)"
            " WHERE n.nspname = current_schema() AND c.relkind = 'i' AND c.relispartition"
        ).fetchall()
    )
    lines = []
    for line in plan.splitlines():
        scanned = _SCANNED.search(line)
        if scanned and "Scan" in line and _small_partition(conn, scanned.group(1)):
            continue
        lines.append(re.sub(r"\b\w+\b", lambda m: roots.get(m.group(0), m.group(0)), line))
    return "\n".join(lines)


def _small_partition(conn: db.Connection, name: str) -> bool:
    row = conn.execute(
        "SELECT relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relname = %s AND c.relkind = 'r'",
        [name],
    ).fetchone()
    if row is None or not row[0]:
        return False
    found = conn.execute(
        f'SELECT count(*) FROM (SELECT 1 FROM "{name}" LIMIT {SMALL_ROWS}) AS s'
    ).fetchone()
    return found is not None and found[0] < SMALL_ROWS


def numbered(text: str) -> tuple[list[str], str]:
    """``text`` with its ``%(name)s`` parameters as ``$1``, ``$2``... for PREPARE, and the
    names in that order."""
    names = list(dict.fromkeys(_PARAM.findall(text)))
    return names, _PARAM.sub(lambda m: f"${names.index(m.group(1)) + 1}", text)


# Parameters for each statement of the hot path, a batch of 400 runs where it takes a list.
_IDS = list(range(1, 401))
_CLAIMS = {"worker_id": "w", "ids": _IDS, "attempts": [1] * len(_IDS)}
_TYPES = {"job_types": ["noop"], "leases": [60], "max_attempts": [10]}
_LOWS = {"lows": [datetime(2026, 1, 1, tzinfo=UTC)], "looks": [False], "look_froms": [None]}
HOT_PATH: dict[str, dict[str, Any]] = {
    "claim": _TYPES | _LOWS | {"worker_id": "w", "limit": 256},
    "claim_limited": _TYPES
    | _LOWS
    | {"worker_id": "w", "limit": 256, "max_running": [2], "per_key": [1], "rates": [10]}
    | {"key_paths": [None], "rate_windows": [60.0], "key_rates": [None], "key_windows": [None]},
    "succeed": _CLAIMS | {"results": ['{"a": 1}'] * len(_IDS)},
    "heartbeat": _CLAIMS | {"leases": [60] * len(_IDS)},
    "fail": _CLAIMS
    | {
        "errors": ["boom"] * len(_IDS),
        "error_types": ["ValueError"] * len(_IDS),
        "details": ["detail"] * len(_IDS),
        "delays": [5.0] * len(_IDS),
    },
    "release": _CLAIMS | {"hold": 0.0},
    "acknowledge_cancel": _CLAIMS,
    "mark_timed_out": _CLAIMS | {"errors": ["timed out after 5s"] * len(_IDS)},
}
