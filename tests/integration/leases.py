"""What the store tests do to leases by hand: let them run out, as a dead daemon's would."""

from __future__ import annotations

from collections.abc import Sequence

from pgtick.storage import db


def expire(conn: db.Connection, run_ids: Sequence[int]) -> None:
    """What a dead daemon leaves behind: its leases run out (the reaper may take the runs)."""
    conn.execute(
        "UPDATE runs SET locked_until = now() - interval '1 second' WHERE id = ANY(%s)",
        [list(run_ids)],
    )
