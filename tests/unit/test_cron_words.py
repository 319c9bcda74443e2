"""Cron strings in words for the console: the common shapes read as a person would say them,
and the rest give None (shown as written) rather than a guess; each wording agrees with the
occurrences Cron computes for the fixed-time ones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pgtick.scheduling.cron import Cron
from pgtick.scheduling.words import cron_in_words

AMS = "Europe/Amsterdam"


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("0 3 * * *", "at 03:00 every day"),
        ("0 3 1 1 *", "at 03:00 on 1 January"),
        ("15 * * * *", "at minute 15 of every hour"),
        ("*/5 * * * *", "every 5 minutes"),
        ("* * * * *", "every minute"),
        ("30 9 * * 1-5", "at 09:30 on Monday to Friday"),
        ("0 */6 * * *", "at minute 0 every 6 hours"),
        ("0 9,17 * * mon,thu", "at 09:00 and 17:00 on Monday and Thursday"),
        ("0 0 1 * *", "at 00:00 on day 1 of every month"),
        ("0 0 1,15 * *", "at 00:00 on days 1 and 15 of every month"),
        ("0 12 * 6-8 *", "at 12:00 every day in June to August"),
        ("0 8 * * 7", "at 08:00 on Sunday"),
        ("@hourly", "at minute 0 of every hour"),
        ("@weekly", "at 00:00 on Sunday"),
        ("@daily", "at 00:00 every day"),
    ],
)
def test_common_shapes_in_words(expr: str, words: str) -> None:
    assert cron_in_words(expr, AMS) == f"{words}, {AMS}"


@pytest.mark.parametrize(
    "expr",
    ["H 3 * * *", "0 3 L * *", "0 3 * * 1#2", "*/5 9-17 * * *", "0 3 1 * 1", "0 3", "5-1 * * * *"],
)
def test_no_plain_reading_is_none(expr: str) -> None:
    assert cron_in_words(expr, "UTC") is None


def test_a_fixed_time_in_words_is_when_it_runs() -> None:
    cron = Cron.parse("30 9 * * 1-5", AMS)
    for at in cron.next_n(datetime(2026, 3, 25, tzinfo=UTC), 10):
        local = at.astimezone(cron.zone)
        assert (local.hour, local.minute) == (9, 30) and local.weekday() < 5
