"""The ticker's part of `after` between schedules (docs/composition.md, After): for each
occurrence of a schedule that waits for another, the other's occurrence of the same period
(scheduling/period.py), stored with the run; settling is the database's (settle_waiting,
migration 0027)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import structlog

from pgtick.errors import ConfigError
from pgtick.scheduling import period
from pgtick.scheduling.cron import Cron
from pgtick.storage import db
from pgtick.storage.store import Occurrence, RunStore, ScheduleRow

log = structlog.get_logger("pgtick.ticker")


def waits(
    conn: db.Connection, row: ScheduleRow, occurrences: Sequence[Occurrence]
) -> list[Mapping[str, Any] | None]:
    """Per occurrence, what its run waits for (None each when the schedule has no after)."""
    after = row.after_on
    if not after or not occurrences:
        return []
    name = str(after["schedule"])
    source = RunStore.after_source_on(conn, name)
    deadline = float(after.get("deadline_seconds", 3600.0))
    missed = str(after.get("missed", "skip"))
    if source is None:
        log.warning("schedule_after_unknown", schedule=row.name, after=name)
        cron = None
    else:
        try:
            cron = Cron.parse(source[0], source[1], name)
        except (ConfigError, ValueError) as exc:
            log.warning("schedule_after_invalid", schedule=row.name, after=name, error=str(exc))
            cron = None
    out: list[Mapping[str, Any] | None] = []
    for o in occurrences:
        if cron is None:  # no such schedule: the policy applies at the first sweep
            out.append(
                {
                    "schedule": name,
                    "occurrence": o.scheduled_for.isoformat(),
                    "deadline": o.scheduled_for.isoformat(),
                    "missed": missed,
                }
            )
        else:
            out.append(period.wait(name, cron, o.scheduled_for, deadline, missed))
    return out
