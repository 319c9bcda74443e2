"""`after` between schedules (docs/composition.md, After): which occurrence of the other
schedule an occurrence waits for. Pure.

"The same period": the other schedule's latest occurrence at or before this occurrence. Both
schedules' occurrences are computed in their own time zones under the DST rules of
Scheduling and compared as UTC instants, so different crons, zones and DST changes need no
rule of their own: a report at 06:00 Europe/Amsterdam after a billing at 02:00
Europe/Amsterdam waits for that night's billing, on the night the clocks change too (02:00
that does not exist runs at 03:00, still before 06:00); an hourly report after a nightly
billing waits, every hour, for the last night's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pgtick.scheduling.cron import Cron


def waited_occurrence(other: Cron, occurrence: datetime) -> datetime | None:
    """The other schedule's occurrence of ``occurrence``'s period (None: it never fired)."""
    return other.latest_at_or_before(occurrence)


def wait(
    other_name: str,
    other: Cron,
    occurrence: datetime,
    deadline_seconds: float,
    missed: str,
) -> dict[str, Any]:
    """What a run of ``occurrence`` stores while it waits (runs.after_on, migration 0027)."""
    waited = waited_occurrence(other, occurrence)
    return {
        "schedule": other_name,
        # No occurrence at all: one that can never come, settled by the policy at once.
        "occurrence": (waited or datetime.min.replace(tzinfo=occurrence.tzinfo)).isoformat(),
        "deadline": (occurrence + timedelta(seconds=deadline_seconds)).isoformat(),
        "missed": missed,
    }
