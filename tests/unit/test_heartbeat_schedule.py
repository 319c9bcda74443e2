"""When the heartbeat beats next: every interval; while another session holds a run's row
locked (the beat skipped it), at least every BLOCKED_BEAT_SECONDS and once just before that
run's lease ends, so that the reapers see the holder alive at the lease's end and leave the
run to it (reaper.py, holder_not_alive in queries.sql)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pgtick.config.schema import MIN_LEASE_SECONDS
from pgtick.core.heartbeat import BLOCKED_BEAT_SECONDS, Heartbeat
from pgtick.core.lifecycle import Held, Lifecycle
from pgtick.storage.store import (
    HOLDER_ALIVE_SECONDS,
    LEASE_END_SLACK_SECONDS,
    Beat,
    Lease,
    WorkerInfo,
)
from tests.unit.test_lifecycle import World

INTERVAL_SECONDS = 20.0


class Store:
    """The heartbeat statement's answer: every lease renewed but the row-locked ones."""

    def __init__(self) -> None:
        self.locked: set[int] = set()
        self.asked: list[set[int]] = []

    def heartbeat(self, worker_id: str, leases: Sequence[Lease]) -> Beat:
        ids = {lease.run_id for lease in leases}
        self.asked.append(ids)
        return Beat(ids - self.locked, True, set(), ids & self.locked)


class Worker:
    worker_id = "w"

    def __init__(self, life: Lifecycle) -> None:
        self.life = life
        self.giveback = self  # what the heartbeat asks of giveback.py, here

    def let_go(self, given_up: list[Held]) -> None:
        raise AssertionError(f"nothing is lost here: {given_up}")

    def wake(self) -> None:
        pass

    def release_stale(self, store: Store) -> None:
        pass


def _heartbeat(world: World, store: Store) -> Heartbeat:
    info = WorkerInfo("w", "host", 1, "0", 1, ["py"])
    return Heartbeat(store, Worker(world.life), INTERVAL_SECONDS, world.metrics, info)  # type: ignore[arg-type]


def test_the_margins_hold_together() -> None:
    """A stopped holder beat last a whole lease before its end: never within the slack.
    A blocked holder beats several times within the time it counts as alive."""
    assert LEASE_END_SLACK_SECONDS < MIN_LEASE_SECONDS
    assert BLOCKED_BEAT_SECONDS * 3 <= HOLDER_ALIVE_SECONDS


def test_a_beat_that_skips_a_locked_run_beats_again_soon_and_at_its_lease_end() -> None:
    """Between full beats, beats of the locked run alone: every second, and a quarter-second
    before its lease ends; once it is renewed, only the full beats again."""
    world, store = World(), Store()
    held = world.running()  # accepted at 1000.0, lease 60 s: it ends at 1060.0
    other = world.running()
    beat = _heartbeat(world, store)
    assert beat.beaten(1000.0, full=True) == 1000.0 + INTERVAL_SECONDS
    store.locked = {held.id}
    beat.beat()  # (a renewal would count from the real clock: the world's has no beat yet)
    assert store.asked == [{held.id, other.id}]
    assert beat.beaten(1050.0, full=True) == 1050.0 + BLOCKED_BEAT_SECONDS
    # Beats between two full ones ask about the locked run only.
    beat.beat(only_blocked=True)
    assert store.asked[-1] == {held.id}
    # Just before the lease ends: a beat a quarter-second before it, not a second later.
    assert beat.beaten(1059.5, full=False) == pytest.approx(1060.0 - LEASE_END_SLACK_SECONDS / 2)
    # Past that point (this beat is the one at the end) and after the end: every second,
    # and the full beat when it is due.
    assert beat.beaten(1059.8, full=False) == pytest.approx(1059.8 + BLOCKED_BEAT_SECONDS)
    assert beat.beaten(1069.5, full=False) == 1050.0 + INTERVAL_SECONDS
    store.locked = set()
    beat.beat(only_blocked=True)  # the lock went: renewed, back to the full beats
    assert beat.beaten(1065.0, full=False) == 1050.0 + INTERVAL_SECONDS
