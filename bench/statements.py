"""Every statement of the system under test, by the ``queries.sql`` block it comes from, compared
between two windows (queue-health, soak): calls, time per call, time per claimed run, shared
buffers per call, and the ratios.

A statement's entries in ``pg_stat_statements`` are named by matching their text against the
blocks of pgtick's ``queries.sql`` as the daemon sends them (``pgtick.storage.sqlfile``, the
file's own loader): ``pg_stat_statements`` replaces constants with ``$n`` and psycopg sends
parameters as ``$n``, so the two are compared by their words only (keywords, identifiers,
casts), literals and parameters left out. A block whose words another's equal is named by both
(``enqueue/enqueue_qualified``). Entries of one block are added up: PostgreSQL can count one
statement under a second queryid (its relations' OIDs are part of it, and a retention that
drops and creates partitions changes what the statement's plan names), and a statement matched
by queryid alone would then fall out of the comparison. What matches no block (a peer's
statements, the pool's checks) is named by its first words.

Time per claimed run is the statement's time in the window over the runs the claim statements
claimed in it, whatever the statement: what each run costs of it, flat when the statement's
work follows the load and rising when something else grows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench import common, load
from pgtick.storage import sqlfile

# Tokens of a statement, in order: quoted identifiers, string literals and parameters ($1 or
# %(name)s), words, numbers, anything else one character at a time.
TOKEN = re.compile(
    r"""(?P<quoted>"(?:[^"]|"")*")|(?P<value>'(?:[^']|'')*'|\$\d+|%\([A-Za-z_]\w*\)s|\d+(?:\.\d+)?)"""
    r"""|(?P<word>[A-Za-z_][\w$]*)|\S"""
)
# What pg_stat_statements makes a constant besides literals: NULL, true and false (values
# wherever they are, IS NULL too, on both sides alike), the field of extract() (a string to the
# parser), and the type name of a typed literal (interval '1 second': the constant may start
# at the type name), left out as any word right before a value.
CONSTANT_WORDS = frozenset({"null", "true", "false"})
EXTRACT_FIELD = re.compile(r"(?i)\bextract\s*\(\s*[A-Za-z_]\w*\s+from\b")
PLACEHOLDER = re.compile(r"(?<!\{)\{(\w+)\}(?!\})")
LABEL_WORDS = 8
# A window without statement figures (``window_figures``'s shape).
NONE: Mapping[str, Any] = {"claimed_runs": 0, "blocks": {}}
# A statement is judged (a ratio against a bar) with at least this many calls in both windows.
DEFAULT_MIN_CALLS = 10


def signature(text: str) -> tuple[str, ...]:
    """The words of a statement as pg_stat_statements keeps them whatever the constants,
    lowercased; a quoted identifier counts as its name."""
    tokens: list[tuple[str, str]] = []
    for match in TOKEN.finditer(EXTRACT_FIELD.sub("extract( from", text)):
        kind = match.lastgroup or "other"
        value = match.group()
        if kind == "quoted":
            kind, value = "word", value[1:-1].replace('""', '"')
        elif kind == "word" and value.lower() in CONSTANT_WORDS:
            kind = "value"
        tokens.append((kind, value.lower()))
    words = []
    for i, (kind, value) in enumerate(tokens):
        if kind != "word":
            continue
        if i + 1 < len(tokens) and tokens[i + 1][0] == "value":
            continue
        words.append(value)
    return tuple(words)


@functools.cache
def block_names(schema: str = common.SCHEMA) -> dict[tuple[str, ...], str]:
    """{signature: block name} of every block of queries.sql, rendered for ``schema``."""
    names: dict[tuple[str, ...], list[str]] = {}
    for name, text in sqlfile.queries().items():
        # {schema} is the schema's identifier; the other fields ({channel}, {runs_table}, a
        # role's name) are literals or names the signature leaves out or cannot know.
        rendered = PLACEHOLDER.sub(lambda m: schema if m.group(1) == "schema" else "''", text)
        names.setdefault(signature(rendered), []).append(name)
    return {sig: "/".join(found) for sig, found in names.items()}


def name_of(text: str, schema: str = common.SCHEMA) -> str:
    """The block ``text`` was sent from, or its first words (with "sql: " before them)."""
    found = block_names(schema).get(signature(text))
    if found:
        return found
    words = " ".join(text.split()).split(" ")
    return "sql: " + " ".join(words[:LABEL_WORDS]) + (" ..." if len(words) > LABEL_WORDS else "")


@dataclass(frozen=True)
class Window:
    """One block's work in a window: calls, time, rows returned or changed, shared buffers
    hit or read."""

    calls: int
    total_ms: float
    rows: int
    buffers: int

    def per_call_us(self) -> float | None:
        return self.total_ms * 1000 / self.calls if self.calls else None

    def per_run_us(self, claimed: int) -> float | None:
        return self.total_ms * 1000 / claimed if claimed else None

    def buffers_per_call(self) -> float | None:
        return self.buffers / self.calls if self.calls else None


def by_block(
    deltas: Mapping[int, load.StatementDelta], schema: str = common.SCHEMA
) -> dict[str, Window]:
    """A window's statement deltas added up by block."""
    out: dict[str, list[int | float]] = {}
    for d in deltas.values():
        acc = out.setdefault(name_of(d.query, schema), [0, 0.0, 0, 0])
        acc[0] += d.calls
        acc[1] += d.total_ms
        acc[2] += d.rows
        acc[3] += d.buffers
    return {
        name: Window(int(calls), float(total), int(rows), int(buffers))
        for name, (calls, total, rows, buffers) in out.items()
    }


def window_figures(deltas: Mapping[int, load.StatementDelta]) -> dict[str, Any]:
    """What a window's JSON keeps of its statements: the runs claimed, and per block its
    calls, time, rows and buffers (the comparison is computed from these)."""
    claimed = load.combined(deltas, load.CLAIM).rows
    return {
        "claimed_runs": claimed,
        "blocks": {name: w.__dict__ for name, w in sorted(by_block(deltas).items())},
    }


def compare(
    first: Mapping[str, Any], last: Mapping[str, Any], bar: float, min_calls: int
) -> list[dict[str, Any]]:
    """Each block of either window (``window_figures``): per call and per claimed run in both,
    the ratios, and the verdict on the per-run ratio against ``bar`` for a block with
    ``min_calls`` calls in both windows (None: not judged). Most time per run last first."""
    a_claimed, b_claimed = int(first["claimed_runs"]), int(last["claimed_runs"])
    a_blocks, b_blocks = first["blocks"], last["blocks"]
    rows = []
    for name in sorted(set(a_blocks) | set(b_blocks)):
        a = Window(**a_blocks[name]) if name in a_blocks else Window(0, 0.0, 0, 0)
        b = Window(**b_blocks[name]) if name in b_blocks else Window(0, 0.0, 0, 0)
        per_run = load.ratio(b.per_run_us(b_claimed), a.per_run_us(a_claimed))
        judged = a.calls >= min_calls and b.calls >= min_calls
        rows.append(
            {
                "statement": name,
                "calls_first": a.calls,
                "calls_last": b.calls,
                "us_per_call_first": a.per_call_us(),
                "us_per_call_last": b.per_call_us(),
                "per_call_ratio": load.ratio(b.per_call_us(), a.per_call_us()),
                "us_per_run_first": a.per_run_us(a_claimed),
                "us_per_run_last": b.per_run_us(b_claimed),
                "per_run_ratio": per_run,
                "buffers_per_call_first": a.buffers_per_call(),
                "buffers_per_call_last": b.buffers_per_call(),
                "ok": load.below(per_run, bar) if judged else None,
            }
        )
    return sorted(rows, key=lambda r: -(r["us_per_run_last"] or 0.0))


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The worst judged per-run ratio, and whether every judged one is under the bar."""
    judged = [r for r in rows if r["ok"] is not None]
    return {
        "judged": len(judged),
        "worst_per_run_ratio": max((r["per_run_ratio"] or 0.0 for r in judged), default=None),
        "ok": None if not judged else all(r["ok"] for r in judged),
    }


def table(rows: list[dict[str, Any]], first: str, last: str) -> str:
    """The comparison as a text table, ``first`` and ``last`` naming the two windows."""
    return common.table(
        [
            "statement (block)",
            f"calls {first}",
            f"calls {last}",
            f"us/call {first}",
            f"us/call {last}",
            "ratio",
            f"us/run {first}",
            f"us/run {last}",
            "ratio",
            f"bufs/call {first}",
            f"bufs/call {last}",
            "bar",
        ],
        [
            [
                r["statement"][:60],
                r["calls_first"],
                r["calls_last"],
                load.fmt(r["us_per_call_first"], 1),
                load.fmt(r["us_per_call_last"], 1),
                load.fmt(r["per_call_ratio"], 1, "x"),
                load.fmt(r["us_per_run_first"], 2),
                load.fmt(r["us_per_run_last"], 2),
                load.fmt(r["per_run_ratio"], 1, "x"),
                load.fmt(r["buffers_per_call_first"], 1),
                load.fmt(r["buffers_per_call_last"], 1),
                "" if r["ok"] is None else load.verdict(r["ok"]),
            ]
            for r in rows
        ],
    )
