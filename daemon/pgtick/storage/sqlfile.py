"""Loads ``sql/queries.sql`` once into named statements, so one file shows every query."""

from __future__ import annotations

import functools
import importlib.resources
import re

from psycopg import sql

_HEADER = re.compile(r"^-- ([a-z_]+) --$")
# A line ``-- include: NAME`` stands for block NAME's text: SQL that two statements share (the
# counts behind flow control's limits, the claims' result, the reaper's range) is written once.
_INCLUDE = re.compile(r"^-- include: ([a-z_]+)$")


def parse_blocks(text: str) -> dict[str, str]:
    """Split a ``-- name --`` delimited file into {name: statement}; comment lines are dropped,
    ``-- include: NAME`` lines replaced by block NAME (which includes nothing itself)."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            name = match.group(1)
            if name in blocks:
                raise ValueError(f"queries.sql: block {name!r} defined twice")
            current = blocks[name] = []
        elif current is not None and (
            _INCLUDE.match(line.strip()) or not line.lstrip().startswith("--")
        ):
            current.append(line)
    parsed = {name: "\n".join(lines).strip().rstrip(";") for name, lines in blocks.items()}

    def expand(line: str) -> str:
        include = _INCLUDE.match(line.strip())
        if include is None:
            return line
        name = include.group(1)
        if name not in parsed or any(_INCLUDE.match(x.strip()) for x in parsed[name].splitlines()):
            raise ValueError(f"queries.sql: cannot include block {name!r}")
        return parsed[name]

    return {
        name: "\n".join(expand(line) for line in text.splitlines()) for name, text in parsed.items()
    }


@functools.cache
def queries() -> dict[str, str]:
    """All named queries of ``sql/queries.sql``."""
    text = (
        importlib.resources.files("pgtick.storage").joinpath("sql/queries.sql").read_text("utf-8")
    )
    return parse_blocks(text)


@functools.cache
def query(name: str, schema: str) -> sql.SQL:
    """One named query for ``schema``, ready to execute (``%(param)s`` placeholders).

    Every table and function a statement names is qualified with the schema (``{schema}``,
    a quoted identifier; ``{channel}`` is the schema's name as a string, the NOTIFY channel;
    ``{runs_table}`` the runs table's qualified name as a string), so no statement depends on
    a connection's ``search_path``: behind a transaction-mode pooler (PgBouncer) each statement
    may land on a different server connection, where a ``SET`` sent earlier never happened.
    Rendered once per (name, schema).
    """
    ident = sql.Identifier(schema)
    rendered = sql.SQL(queries()[name]).format(
        schema=ident,
        channel=sql.Literal(schema),
        runs_table=sql.Literal(f"{ident.as_string(None)}.runs"),
    )
    return sql.SQL(rendered.as_string(None))


def with_schema(name: str, schema: str) -> sql.SQL:
    """A named query for ``schema`` (the same as ``query``; kept for the statements whose
    whole point is the schema's identifier: CREATE SCHEMA, LISTEN)."""
    return query(name, schema)
