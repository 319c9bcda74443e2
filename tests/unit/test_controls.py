"""The daemon's view of runtime controls, without a database: which types a claim names and
with what limits (core/controls.py), and when the dispatcher reads them again."""

from __future__ import annotations

import pytest

from pgtick.core.controls import ControlsClock, overridden, with_controls
from pgtick.storage.store import ClaimType, JobTypeControl

BASE = [
    ClaimType("a", 60.0, 3, max_running=5, rate=(100, 60.0)),
    ClaimType("b", 60.0, 3),
    ClaimType("c", 60.0, 3, max_running_per_key=1),
]


def test_a_paused_type_is_left_out_and_the_others_keep_their_config() -> None:
    types, paused = with_controls(BASE, {"b": JobTypeControl("b", paused=True)})
    assert paused == frozenset({"b"})
    assert types == [BASE[0], BASE[2]]


def test_an_override_replaces_only_the_limits_it_names() -> None:
    control = JobTypeControl("a", max_running=1, rate_per_key=(2, 1.0))
    types, paused = with_controls(BASE, {"a": control})
    assert paused == frozenset()
    assert types[0] == ClaimType(
        "a", 60.0, 3, max_running=1, rate=(100, 60.0), rate_per_key=(2, 1.0)
    )
    assert types[1:] == BASE[1:]


def test_a_limit_at_runtime_makes_an_unlimited_type_limited() -> None:
    assert not BASE[1].limited
    assert overridden(BASE[1], JobTypeControl("b", max_running=2)).limited
    assert overridden(BASE[1], JobTypeControl("b", paused=True)) == BASE[1]
    assert overridden(BASE[1], None) == BASE[1]


def test_controls_are_read_first_then_on_a_change_or_after_their_interval() -> None:
    notifying = [True]
    clock = ControlsClock(5.0, lambda: notifying[0], safety_seconds=60.0)
    assert clock.due()  # before the first claim
    clock.reading()
    assert not clock.due()
    clock.changed()  # a !controls NOTIFY, or LISTEN reconnected
    assert clock.due()
    clock.reading()
    assert not clock.due()
    notifying[0] = False
    clock._read_at -= 5.0  # no LISTEN connection: every poll interval
    assert clock.due()
    clock.reading()
    notifying[0] = True
    clock._read_at -= 59.0
    assert not clock.due()
    clock._read_at -= 1.0
    assert clock.due()
    assert clock.reads == 3


def test_a_failed_read_leaves_the_controls_due() -> None:
    """A read that fails (the connection lost) is made again before the next claim, not at
    the next NOTIFY or safety read (60 s): a pause announced just before would wait that long."""
    clock = ControlsClock(5.0, lambda: True, safety_seconds=60.0)

    def lost() -> dict[str, JobTypeControl]:
        raise ConnectionError("server closed the connection")

    clock.changed()
    with pytest.raises(ConnectionError):
        clock.read(lost)
    assert clock.due()
    assert clock.read(dict) == {}
    assert not clock.due()
