"""`pgtick enqueue` arguments that are valid argv but that jsonb or Python cannot take: a usage
error naming the option (exit 2), with nothing written. Before, they crashed the CLI (exit 1,
"internal error") or failed in the database (exit 3)."""

from __future__ import annotations

import pytest

from tests import dbhelp
from tests.acceptance.cli import pgtick

DEEP = 5000  # deeper than Python's recursion limit lets json.loads read

CASES: dict[str, tuple[tuple[str, ...], str, str]] = {
    # json.loads turns 1e400 into inf without calling parse_constant; jsonb refuses it.
    "payload number beyond a float": (("--payload", '{"a": 1e400}'), "", "--payload"),
    # int() of more than 4300 digits raises ValueError, not JSONDecodeError.
    "payload integer of 5000 digits": (
        ("--payload", "-"),
        '{"a": ' + "9" * 5000 + "}",
        "--payload",
    ),
    # json.loads recurses per level: RecursionError.
    "payload nested 5000 deep": (
        ("--payload", "-"),
        '{"a": ' + "[" * DEEP + "]" * DEEP + "}",
        "--payload",
    ),
    # A JSON escape of a lone surrogate: json.loads accepts it, jsonb refuses it.
    "payload lone surrogate escape": (("--payload", '{"a": "\\ud800"}'), "", "--payload"),
    # A non-UTF-8 byte in argv arrives as a surrogate escape.
    "payload non-UTF-8 byte": (("--payload", '{"a": "\udcff"}'), "", "--payload"),
    "key non-UTF-8 byte": (("--key", "k\udcff"), "", "--key"),
    "concurrency key non-UTF-8 byte": (("--concurrency-key", "k\udcff"), "", "--concurrency-key"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_enqueue_refuses_bad_argument_with_exit_2(
    name: str, dsn: str, conn: dbhelp.Connection
) -> None:
    argv, stdin, option = CASES[name]
    result = pgtick(dsn, "enqueue", "noop", *argv, stdin=stdin)
    assert result.code == 2, (result.code, result.err)
    line = [e for e in result.err if "warning" not in e]
    assert len(line) == 1 and option in line[0] and "internal error" not in line[0], result.err
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (0,)


def test_enqueue_takes_a_payload_nested_400_deep(dsn: str, conn: dbhelp.Connection) -> None:
    """jsonb takes it, and so does the CLI (the check for NUL characters recursed, two frames
    a level, and crashed at about 400 levels)."""
    deep = '{"a": ' + "[" * 400 + "]" * 400 + "}"
    result = pgtick(dsn, "enqueue", "noop", "--payload", "-", stdin=deep)
    assert result.code == 0, (result.code, result.err)
    assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)
