"""queries.sql's blocks: names, comments dropped, and ``-- include: NAME`` (shared SQL once)."""

from __future__ import annotations

import pytest

from pgtick.storage import sqlfile

TEXT = """
-- shared --
-- what it is
a AS (SELECT 1)

-- user --
WITH
-- include: shared
, b AS (SELECT 2)
SELECT * FROM a, b;
"""


def test_an_include_line_stands_for_the_block_and_comments_go() -> None:
    blocks = sqlfile.parse_blocks(TEXT)
    assert blocks["shared"] == "a AS (SELECT 1)"
    assert blocks["user"] == "WITH\na AS (SELECT 1)\n, b AS (SELECT 2)\nSELECT * FROM a, b"


@pytest.mark.parametrize(
    "text",
    [
        "-- user --\n-- include: missing\nSELECT 1;",
        "-- a --\n-- include: b\n-- b --\n-- include: a\n",
    ],
)
def test_an_include_of_nothing_or_of_an_include_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="cannot include block"):
        sqlfile.parse_blocks(text)


def test_both_flow_statements_carry_the_shared_counts() -> None:
    queries = sqlfile.queries()
    for name in ("claim_limited", "flow_state"):
        assert queries["limit_counts"] in queries[name], name
        assert "include:" not in queries[name]


def test_shared_ends_and_ranges_are_in_each_statement_that_includes_them() -> None:
    """Both claims end with the same result and look back; the reaper's look asks exactly
    what its select locks."""
    queries = sqlfile.queries()
    for shared, names in [
        ("claim_result", ("claim", "claim_limited")),
        ("ended_leases", ("reap_look", "reap_select")),
        ("holder_not_alive", ("reap_look", "reap_select")),
    ]:
        for name in names:
            assert queries[shared] in queries[name], name
            assert "include:" not in queries[name]
