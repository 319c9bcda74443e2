"""Backoff properties: monotone before jitter, within the cap, jitter within its band, the
formula table per policy, bad parameters refused."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgtick.core.backoff import Backoff

kinds = st.sampled_from(["exponential", "linear", "fixed"])
seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)
jitters = st.floats(min_value=0, max_value=0.99)
attempts = st.integers(min_value=1, max_value=5000)


@given(kinds, seconds, seconds, attempts)
def test_monotone_before_jitter(kind: str, base: float, cap: float, n: int) -> None:
    b = Backoff(kind, base, cap, 0.0)
    assert b.base_delay(n) <= b.base_delay(n + 1)


@given(kinds, seconds, seconds, jitters, attempts, st.integers())
def test_never_above_max_never_negative(
    kind: str, base: float, cap: float, jitter: float, n: int, seed: int
) -> None:
    d = Backoff(kind, base, cap, jitter).delay(n, random.Random(seed))
    assert 0 <= d <= cap


@given(kinds, seconds, seconds, jitters, attempts, st.integers())
def test_jitter_within_bounds(
    kind: str, base: float, cap: float, jitter: float, n: int, seed: int
) -> None:
    b = Backoff(kind, base, cap, jitter)
    raw = b.base_delay(n)
    d = b.delay(n, random.Random(seed))
    assert raw * (1 - jitter) - 1e-9 <= d <= min(cap, raw * (1 + jitter)) + 1e-9


def test_jitter_actually_varies() -> None:
    b = Backoff("exponential", 10, 3600, 0.2)
    rng = random.Random(1)
    values = {round(b.delay(3, rng), 6) for _ in range(50)}
    assert len(values) > 40
    assert min(values) < 40 < max(values)


def test_formula_table() -> None:
    exp = Backoff("exponential", 10, 3600, 0.0)
    assert [exp.delay(n) for n in range(1, 11)] == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600]
    assert [Backoff("linear", 10, 35, 0).delay(n) for n in range(1, 6)] == [10, 20, 30, 35, 35]
    assert [Backoff("fixed", 7, 3600, 0).delay(n) for n in (1, 50)] == [7, 7]


@pytest.mark.parametrize(
    "kwargs", [{"kind": "expo"}, {"jitter": 1.0}, {"jitter": -0.1}, {"base_seconds": -1}]
)
def test_bad_parameters_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        Backoff().delay(0)
