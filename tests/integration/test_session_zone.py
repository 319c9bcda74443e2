"""A pool connection names its time zone "UTC" when the server's is UTC under another name
(Etc/UTC, initdb's usual default): psycopg then gives timestamps in Python's own UTC instead
of converting each one to a ZoneInfo, a cost the claim's result paid for every row. The
instants are the same; a real zone (or GMT, whose tzname differs) is left as it is."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from psycopg.conninfo import make_conninfo

from pgtick.storage import db
from tests.conftest import SCHEMA


def pool_zone(dsn: str, zone: str) -> tuple[str | None, datetime, datetime]:
    """The zone a pool connection ends up in, when the server's is ``zone``, and one
    timestamp read through it and through a plain connection."""
    with_zone = make_conninfo(dsn, options=f"-c TimeZone={zone}")
    pool = db.make_pool(with_zone, SCHEMA, size=1, name="pgtick-test-zone")
    try:
        with pool.connection() as conn:
            name = conn.info.parameter_status("TimeZone")
            [(pooled,)] = conn.execute("SELECT '2026-11-27 04:41:05.123456+00'::timestamptz")
    finally:
        pool.close()
    with db.connect(with_zone, SCHEMA) as plain:
        [(direct,)] = plain.execute("SELECT '2026-11-27 04:41:05.123456+00'::timestamptz")
    return name, pooled, direct


@pytest.mark.parametrize("zone", sorted(db.UTC_ALIASES))
def test_a_utc_alias_is_named_utc(dsn: str, zone: str) -> None:
    name, pooled, direct = pool_zone(dsn, zone)
    assert name == "UTC"
    assert pooled.tzinfo is UTC
    assert direct.tzinfo == ZoneInfo(zone)  # what the connection would have given
    assert pooled == direct == datetime(2026, 11, 27, 4, 41, 5, 123456, tzinfo=UTC)
    assert pooled.tzname() == direct.tzname() == "UTC"


@pytest.mark.parametrize("zone", ["Europe/Berlin", "GMT", "America/New_York"])
def test_another_zone_is_kept(dsn: str, zone: str) -> None:
    name, pooled, direct = pool_zone(dsn, zone)
    assert name == zone
    assert pooled.tzinfo == direct.tzinfo == ZoneInfo(zone)
    assert pooled == direct
