"""The rollups (migration 0023): per job type, the runs that ended and the attempts that failed
per minute and per hour, kept by the daemons so that the console's 24-hour and 7-day charts
read a few hundred small rows instead of scanning runs.

A daemon's maintenance calls ``roll_up`` about once a minute (one daemon of a fleet does the
work, the others find its lock taken); retention drops the rollups' partitions with the rest
(``rollup_retention``: the keys its pass adds to the runs' retention).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from pgtick.storage import sqlfile
from pgtick.storage.base import StoreBase

# A minute is rolled up this long after its end: a finish is dated by its transaction's start
# and commits after it (a finish committed later than this is left out of its minute).
ROLLUP_SETTLE_SECONDS = 30.0
# One step rolls up at most this many minutes (one short statement); a pass takes steps
# until it is caught up or has worked ROLLUP_PASS_SECONDS (the reaper's loop calls it: a
# fleet back after a day away, or the first pass after the upgrade on a busy history,
# catches up over a few passes rather than hold the reaper up for minutes).
ROLLUP_STEP_MINUTES = 60
ROLLUP_PASS_SECONDS = 2.0
# The minute rows are kept this long (or the longest run retention, if shorter): long enough
# for every hour to be summed from them, and for the current hour of the charts.
ROLLUP_MINUTES_KEEP_SECONDS = 86400.0
# Neither is kept less than an hour, whatever the runs' retention: an hour is summed from its
# minutes once it has ended, and a shorter retention would only cut their partitions finer
# (a 2-minute retention: 31 partitions ahead of each, created at every daemon's start).
ROLLUP_MIN_KEEP_SECONDS = 3600.0
# Retention keys of the rollups' parents (partitioned_tables.status, migration 0023).
ROLLUP_PARENTS = ("rollup_minutes", "rollup_hours")


def rollup_retention(by_status: Mapping[str, float]) -> dict[str, float]:
    """The retention of ``by_status`` (seconds per terminal status) with the rollups': the
    hours as long as the longest status is kept, the minutes a day at most; an hour at least."""
    longest = max(max(by_status.values()), ROLLUP_MIN_KEEP_SECONDS)
    return {
        **by_status,
        "rollup_hours": longest,
        "rollup_minutes": min(longest, ROLLUP_MINUTES_KEEP_SECONDS),
    }


@dataclass(frozen=True)
class RollupBucket:
    """One hour of a job type: runs that ended and attempts that failed in it."""

    start: datetime
    succeeded: int
    failed: int  # attempts that failed (a dead run's last one included)
    lost: int  # attempts whose daemon died or froze
    dead: int
    cancelled: int
    skipped: int
    run_seconds: float  # the succeeded runs' last attempts, summed

    @property
    def failures(self) -> int:
        """Attempts that did not succeed and were not let go: what the charts show in red."""
        return self.failed + self.lost


class RollupQueries(StoreBase):
    """Writing the rollups (the daemons' maintenance) and reading them (the console)."""

    def roll_up(
        self,
        back_seconds: float,
        *,
        settle_seconds: float = ROLLUP_SETTLE_SECONDS,
        step_minutes: int = ROLLUP_STEP_MINUTES,
        pass_seconds: float = ROLLUP_PASS_SECONDS,
    ) -> tuple[int, bool]:
        """Roll up the minutes closed since the last call (on a first call, from about
        ``back_seconds`` ago), a step of ``step_minutes`` per transaction so that none holds
        its snapshot long, until caught up or ``pass_seconds`` have passed; returns the
        minutes rolled up and whether it caught up (False: call again soon)."""
        params = {"settle": settle_seconds, "back": back_seconds, "max_minutes": step_minutes}
        total = 0
        until = time.monotonic() + pass_seconds
        while True:
            # One statement: its own transaction (connections are in autocommit).
            done = int(self._all("rollup", "roll_up_runs", params)[0][0] or 0)
            total += done
            if done < step_minutes:
                return total, True
            if time.monotonic() >= until:
                return total, False

    def rollup_per_hour(self, job_type: str, since: datetime) -> list[RollupBucket]:
        """``job_type``'s hours from ``since`` (an hour's start) on, oldest first; hours
        with nothing in them are absent. In a savepoint inside ``reading``, so a timeout
        here spares the rest of the page."""
        with self._conn("rollup") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("rollup_per_hour", conn.schema),
                {"job_type": job_type, "since": since},
            ).fetchall()
        return [
            RollupBucket(at, int(ok), int(f), int(lo), int(d), int(c), int(s), float(sec))
            for at, ok, f, lo, d, c, s, sec in rows
        ]

    def rollup_totals(self, job_types: list[str], since: datetime) -> dict[str, RollupBucket]:
        """Per job type of ``job_types`` with anything in it, the sums from ``since`` (an
        hour's start) on, as one bucket starting there; in a savepoint, like the others."""
        with self._conn("rollup") as conn, conn.transaction():
            rows = conn.execute(
                sqlfile.query("rollup_totals_since", conn.schema),
                {"types": job_types, "since": since},
            ).fetchall()
        return {
            str(t): RollupBucket(since, int(ok), int(f), int(lo), int(d), int(c), int(s), float(x))
            for t, ok, f, lo, d, c, s, x in rows
        }

    def rolled_up_to(self) -> datetime | None:
        """The end of the last minute rolled up (None: nothing yet); in a savepoint too."""
        with self._conn("rollup") as conn, conn.transaction():
            row = conn.execute(sqlfile.query("rollup_rolled_up_to", conn.schema)).fetchone()
        value: datetime | None = row[0] if row else None
        return value
