"""Loads ``sql/queries.sql`` once into named statements, so one file shows every query."""

from __future__ import annotations

import functools
import importlib.resources
import re

from psycopg import sql

_HEADER = re.compile(r"^-- ([a-z_]+) --$")


def parse_blocks(text: str) -> dict[str, str]:
    """Split a ``-- name --`` delimited file into {name: statement}; comment lines are dropped."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            name = match.group(1)
            if name in blocks:
                raise ValueError(f"queries.sql: block {name!r} defined twice")
            current = blocks[name] = []
        elif current is not None and not line.lstrip().startswith("--"):
            current.append(line)
    return {name: "\n".join(lines).strip().rstrip(";") for name, lines in blocks.items()}


@functools.cache
def queries() -> dict[str, str]:
    """All named queries of ``sql/queries.sql``."""
    text = (
        importlib.resources.files("pgtick.storage").joinpath("sql/queries.sql").read_text("utf-8")
    )
    return parse_blocks(text)


def query(name: str) -> sql.SQL:
    """One named query, ready to execute (``%(param)s`` placeholders)."""
    return sql.SQL(queries()[name])


def with_schema(name: str, schema: str) -> sql.Composed:
    """A named query whose ``{schema}`` placeholders are filled with a quoted identifier."""
    return sql.SQL(queries()[name]).format(schema=sql.Identifier(schema))
