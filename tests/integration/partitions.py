"""Partitions as the tests make them: retention only creates partitions from now on, so a
test that needs one in the past (full of runs past their retention) makes it as a retention
pass made it then, with its row in ``partitions``."""

from __future__ import annotations

from psycopg import sql

from pgtick.storage import db


def count(conn: db.Connection, parent: str | None = None) -> int:
    row = conn.execute(
        "SELECT count(*) FROM partitions WHERE %(parent)s::text IS NULL OR parent = %(parent)s",
        {"parent": parent},
    ).fetchone()
    assert row is not None
    return int(row[0])


def past(conn: db.Connection, parent: str, hours_ago: tuple[int, int]) -> str:
    """A partition of ``parent`` for an hour range in the past, as a retention pass made it
    then (retention only creates partitions from now on)."""
    name = f"{parent}_past_{hours_ago[0]}"
    bounds = {"from": f"{hours_ago[0]} hours", "to": f"{hours_ago[1]} hours"}
    frm, to = conn.execute(
        "SELECT date_trunc('hour', now()) - %(from)s::interval,"
        " date_trunc('hour', now()) - %(to)s::interval",
        bounds,
    ).fetchone()  # type: ignore[misc]
    conn.execute(
        sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
            sql.Identifier(name), sql.Identifier(parent), sql.Literal(frm), sql.Literal(to)
        )
    )
    conn.execute(
        "INSERT INTO partitions (name, parent, from_at, to_at) VALUES (%s, %s, %s, %s)",
        [name, parent, frm, to],
    )
    return name
