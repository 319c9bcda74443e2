"""Runtime controls as a daemon applies them: job types paused fleet-wide, and limits that
override the config's (``job_type_controls``, migration 0021; docs/operations/runtime.md).

The dispatcher reads them (one small query) when they may have changed, never per claim: on
a ``!controls`` NOTIFY (the operator's functions send it in their transaction), when the
LISTEN connection (re)connects (NOTIFYs sent while it was away are lost), at every poll
interval while there is no LISTEN connection (a pooler), and every
``SAFETY_REFRESH_SECONDS`` otherwise. What it read is folded into the parameters the claim
already sends: a paused type is left out of the claim's job types, an overridden limit takes
the config's place. The claim's statement is the same as without controls (``bench peers``
measures it unchanged); a limited type's claim also reads its row in the statement
(claim_limited), so a lowered limit holds from the next claim whatever was read here.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from pgtick.storage.store import ClaimType, JobTypeControl, RunStore

T = TypeVar("T")

# With a LISTEN connection, a missed `!controls` NOTIFY (none should be: a reconnect re-reads)
# is made up for within this long.
SAFETY_REFRESH_SECONDS = 60.0
# Due runs held back by a concurrency or rate limit are asked for again this often (sooner
# when a NOTIFY says a slot came free): a rate window frees up with no event to announce it.
FLOW_WAIT_SECONDS = 0.1
MIN_RATE_WAIT_SECONDS = 0.001


def with_controls(
    base: Sequence[ClaimType], controls: Mapping[str, JobTypeControl]
) -> tuple[list[ClaimType], frozenset[str]]:
    """(the claim types to claim with: unpaused, each limit overridden where an operator
    set one; the paused types among ``base``)."""
    active: list[ClaimType] = []
    paused: set[str] = set()
    for t in base:
        control = controls.get(t.job_type)
        if control is None:
            active.append(t)
            continue
        if control.paused:
            paused.add(t.job_type)
            continue
        active.append(overridden(t, control))
    return active, frozenset(paused)


def overridden(t: ClaimType, control: JobTypeControl | None) -> ClaimType:
    """``t`` with the limits ``control`` overrides."""
    if control is None or not control.overrides:
        return t
    return dataclasses.replace(
        t,
        max_running=control.max_running or t.max_running,
        max_running_per_key=control.max_running_per_key or t.max_running_per_key,
        rate=control.rate or t.rate,
        rate_per_key=control.rate_per_key or t.rate_per_key,
    )


class ControlsClock:
    """When the dispatcher should read the controls again (thread-safe: the listener marks
    them stale, the dispatcher asks and reads)."""

    def __init__(
        self,
        poll_interval_seconds: float,
        notifying: Callable[[], bool] = lambda: False,
        safety_seconds: float = SAFETY_REFRESH_SECONDS,
    ) -> None:
        self._poll = poll_interval_seconds
        self.safety_seconds = safety_seconds
        self.notifying = notifying
        self._stale = threading.Event()
        self._stale.set()  # read before the first claim
        self._read_at = -math.inf  # monotonic
        self.reads = 0

    def changed(self) -> None:
        """A ``!controls`` NOTIFY, or the LISTEN connection (re)connected."""
        self._stale.set()

    def due(self) -> bool:
        if self._stale.is_set():
            return True
        every = self.safety_seconds if self.notifying() else self._poll
        return time.monotonic() - self._read_at >= every

    def reading(self) -> None:
        """Called just before a read: a change announced from now on is read again."""
        self._stale.clear()
        self._read_at = time.monotonic()
        self.reads += 1

    def read(self, fetch: Callable[[], T]) -> T:
        """``fetch()`` the controls now; if it fails they are still due (read before the next
        claim, not at the next NOTIFY or safety read)."""
        self.reading()
        try:
            return fetch()
        except BaseException:
            self._stale.set()
            raise


class ClaimTypes:
    """What the dispatcher claims with: the config's claim types (``base``) less the paused,
    with the limits operators override, and what follows from them. Read by the worker's
    threads, replaced whole by the dispatcher's ``apply``."""

    def __init__(self, base: Sequence[ClaimType], poll_interval_seconds: float) -> None:
        self.base = list(base)
        self.clock = ControlsClock(poll_interval_seconds)
        self.paused: frozenset[str] = frozenset()
        self._set(self.base)

    def _set(self, types: list[ClaimType]) -> None:
        self.types = types
        self.claimable = sorted(t.job_type for t in types)  # handled and not paused
        # Types with a limit: a slot they free is announced to the fleet (NOTIFY), and a
        # claim that finds their due runs held back waits instead of asking again at once.
        self.limited = frozenset(t.job_type for t in types if t.limited)
        # Types whose finished runs free a key's slot (a per-key rate frees with time:
        # ClaimBounds puts its bounds back instead).
        self.keyed = frozenset(t.job_type for t in types if t.max_running_per_key)
        self.key_windows = {t.job_type: t.rate_per_key[1] for t in types if t.rate_per_key}

    def apply(self, controls: Mapping[str, JobTypeControl]) -> frozenset[str]:
        """Claim by these controls from now on; returns the types paused by them just now."""
        types, paused = with_controls(self.base, controls)
        newly = paused - self.paused
        self.paused = paused
        self._set(types)
        return newly

    def held_back_wait(self, store: RunStore, empty_claims: int, poll_seconds: float) -> float:
        """Due runs the last claim did not take: held back by a limit, row-locked by another
        session, or taken by another daemon meanwhile. Claim again when a slot frees (a
        NOTIFY, or a run of ours finishing), when a saturated rate window next allows a
        start, or after a short wait (an idle daemon probed and claimed at once again, some
        2 000 times a second, while another session held a due run's row lock)."""
        wait = FLOW_WAIT_SECONDS
        if not self.limited:
            # Nothing of ours frees such a run: doubling waits, up to the poll interval.
            doubled = FLOW_WAIT_SECONDS * 2.0 ** min(empty_claims - 1, 16)
            return min(poll_seconds, max(FLOW_WAIT_SECONDS, doubled))
        free_in = store.rate_free_in(self.types)
        if free_in is not None:
            wait = min(wait, max(MIN_RATE_WAIT_SECONDS, free_in))
        return wait
