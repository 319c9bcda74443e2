"""A job type's last 7 days by the hour, from the rollups the daemons keep (storage.rollup):
what the job type page's 24-hour and 7-day charts show, without a read of runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pgtick.errors import PgtickError
from pgtick.storage.store import RollupBucket, RunStore

HISTORY_HOURS = 7 * 24  # the 7-day chart's hours; the 24-hour chart shows the last 24
DAY_HOURS = 24


@dataclass(frozen=True)
class TypeHistory:
    """One bucket per hour, oldest first, the current hour last (zeros where nothing ended),
    and how far the rollups reach (None: the daemons have rolled up nothing yet)."""

    hours: list[RollupBucket]
    rolled_up_to: datetime | None

    def last(self, count: int) -> list[RollupBucket]:
        return self.hours[-count:]


def _hour(at: datetime) -> datetime:
    """The start of ``at``'s hour in UTC (the rollups' hours; a zone's may be offset)."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def day_totals(
    store: RunStore, job_types: list[str], now: datetime
) -> dict[str, RollupBucket] | None:
    """Per job type of ``job_types``, its last 24 hours (the current hour included) summed
    from the rollups (absent: nothing); None when the read failed or ran out of time."""
    try:
        return store.rollup_totals(job_types, _hour(now) - timedelta(hours=DAY_HOURS - 1))
    except PgtickError:
        return None


def type_history(
    store: RunStore, job_type: str, now: datetime, hours: int = HISTORY_HOURS
) -> TypeHistory | None:
    """``job_type``'s last ``hours`` hours (the current one included) from the rollups; None
    when the read failed or ran out of time (the page shows the rest)."""
    first = _hour(now) - timedelta(hours=hours - 1)
    try:
        found = {b.start: b for b in store.rollup_per_hour(job_type, first)}
        upto = store.rolled_up_to()
    except PgtickError:
        return None
    dense = []
    for i in range(hours):
        start = first + timedelta(hours=i)
        dense.append(found.get(start) or RollupBucket(start, 0, 0, 0, 0, 0, 0, 0.0))
    return TypeHistory(dense, upto)
