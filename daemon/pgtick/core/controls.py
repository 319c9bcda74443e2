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

from pgtick.storage.store import ClaimType, JobTypeControl

# With a LISTEN connection, a missed `!controls` NOTIFY (none should be: a reconnect re-reads)
# is made up for within this long.
SAFETY_REFRESH_SECONDS = 60.0


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
        self._safety = safety_seconds
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
        every = self._safety if self.notifying() else self._poll
        return time.monotonic() - self._read_at >= every

    def reading(self) -> None:
        """Called just before a read: a change announced from now on is read again."""
        self._stale.clear()
        self._read_at = time.monotonic()
        self.reads += 1
