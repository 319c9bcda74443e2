"""The hot path's statements cast each list they read row by row once per statement, not once
per row. psycopg sends a list of small integers as int2[] or int4[] (ids below 2^31, attempt
numbers), and a prepared statement's generic plan, which a daemon runs from a statement's
sixth execution on, evaluates a cast written inline in a row's expression for every row: a
finish of 400 runs cast the list of 400 ids 800 times (a fifth of PostgreSQL's time in a
drain, by perf). Read here from the generic plan, with the parameters typed as psycopg
types them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from psycopg.adapt import PyFormat

from pgtick.storage import db, sqlfile
from tests.integration import plans

# A parameter cast to an array type, then read by position or searched: per row in a filter,
# a SET list or a RETURNING list.
_CAST_READ_PER_ROW = re.compile(
    r"array_position\(\(\$\d+\)::[\w ]+\[\]|width_bucket\([^,()]+, \(\$\d+\)::[\w ]+\[\]"
    r"|\(\(\$\d+\)::[\w ]+\[\]\)\["
)


def generic_plan(conn: db.Connection, name: str, params: dict[str, Any]) -> str:
    """EXPLAIN VERBOSE of ``name``'s generic plan, each parameter declared with the type
    psycopg sends for ``params``' value (``unknown``, inferred by the server, for text)."""
    text = sqlfile.query(name, conn.schema).as_string(conn)
    names, numbered = plans.numbered(text)
    types = []
    for key in names:
        value = params[key]
        dumper = conn.adapters.get_dumper(type(value), PyFormat.AUTO)(type(value), conn)
        oid = dumper.upgrade(value, PyFormat.AUTO).oid
        row = conn.execute("SELECT %s::oid::regtype::text", [oid]).fetchone() if oid else None
        types.append(row[0] if row else "unknown")
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE lists_probe ({', '.join(types)}) AS {numbered}")
        args = ", ".join("NULL" for _ in names)
        try:
            rows = conn.execute(f"EXPLAIN (VERBOSE, COSTS OFF) EXECUTE lists_probe({args})")
            return "\n".join(row[0] for row in rows)
        finally:
            conn.execute("DEALLOCATE lists_probe")


@pytest.mark.parametrize("name", sorted(plans.HOT_PATH))
def test_a_list_is_cast_once_per_statement_not_per_row(conn: db.Connection, name: str) -> None:
    plan = generic_plan(conn, name, plans.HOT_PATH[name])
    per_row = _CAST_READ_PER_ROW.findall(plan)
    assert not per_row, f"{name} casts a list for every row: {per_row}\n{plan}"


@pytest.mark.parametrize("values", [[], [7], [3, 1, 2], [2**40, -(2**62), 0]])
def test_ints_are_sent_as_one_bigint_array(conn: db.Connection, values: list[int]) -> None:
    """The holder's lists of ids and attempts (``db.Ints``): one bigint[] literal, not a list
    dumped element by element, read back as sent, in order, whatever the values' size."""
    [(back, kind)] = conn.execute(
        "SELECT %(ids)s, pg_typeof(%(ids)s)::text", {"ids": db.Ints(values)}
    )
    assert (back, kind) == (values, "bigint[]")
