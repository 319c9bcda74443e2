"""What operators change at runtime, per job type (``job_type_controls``, migration 0021):
a pause fleet-wide, and flow-control limits overriding the config's. Every change goes through
the schema's own SQL functions, which NOTIFY the daemons (``!controls``) in the same
transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgtick.storage.base import StoreBase

Rate = tuple[int, float]  # (starts, window seconds), as ClaimType's


@dataclass(frozen=True)
class LimitChange:
    """Limits to override (None: leave that one as it is)."""

    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None

    @property
    def empty(self) -> bool:
        return all(
            v is None
            for v in (self.max_running, self.max_running_per_key, self.rate, self.rate_per_key)
        )


@dataclass(frozen=True)
class JobTypeControl:
    """One job type's row: its pause and its overridden limits (None: the config's)."""

    job_type: str
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    paused_reason: str | None = None
    max_running: int | None = None
    max_running_per_key: int | None = None
    rate: Rate | None = None
    rate_per_key: Rate | None = None
    limits_at: datetime | None = None
    limits_by: str | None = None

    @property
    def overrides(self) -> bool:
        """Some limit of the config is overridden."""
        return not LimitChange(
            self.max_running, self.max_running_per_key, self.rate, self.rate_per_key
        ).empty


def _rate(limit: int | None, window: float | None) -> Rate | None:
    return None if limit is None or window is None else (int(limit), float(window))


class ControlQueries(StoreBase):
    """The job-type controls aggregate (``job_type_controls``)."""

    def job_type_controls(self) -> dict[str, JobTypeControl]:
        """Every job type an operator paused or limited, by name."""
        found = {}
        for row in self._all("controls", "job_type_controls", {}):
            (job_type, paused, paused_at, paused_by, reason, most, per_key) = row[:7]
            rate, window, key_rate, key_window, limits_at, limits_by = row[7:]
            found[job_type] = JobTypeControl(
                job_type,
                bool(paused),
                paused_at,
                paused_by,
                reason,
                most,
                per_key,
                _rate(rate, window),
                _rate(key_rate, key_window),
                limits_at,
                limits_by,
            )
        return found

    def pause_job_type(self, job_type: str, reason: str | None, actor: str, via: str) -> bool:
        """Pause ``job_type`` fleet-wide; False if it was paused already. Every call of these
        functions is recorded in the audit log by the function (who: ``actor``, ``via``)."""
        params = {"job_type": job_type, "reason": reason, "actor": actor, "via": via}
        return bool(self._all("pause", "pause_job_type", params)[0][0])

    def resume_job_type(self, job_type: str, actor: str, via: str) -> bool:
        """Resume ``job_type``; False if it was not paused."""
        params = {"job_type": job_type, "actor": actor, "via": via}
        return bool(self._all("resume", "resume_job_type", params)[0][0])

    def set_job_type_limits(self, job_type: str, change: LimitChange, actor: str, via: str) -> None:
        """Override the limits ``change`` names; the others stay as they are."""
        params = {
            "job_type": job_type,
            "max_running": change.max_running,
            "max_running_per_key": change.max_running_per_key,
            "rate": change.rate[0] if change.rate else None,
            "rate_window": change.rate[1] if change.rate else None,
            "rate_per_key": change.rate_per_key[0] if change.rate_per_key else None,
            "rate_per_key_window": change.rate_per_key[1] if change.rate_per_key else None,
            "actor": actor,
            "via": via,
        }
        self._all("limits", "set_job_type_limits", params)

    def reset_job_type_limits(self, job_type: str, actor: str, via: str) -> bool:
        """Back to the config's limits; False if none was overridden."""
        params = {"job_type": job_type, "actor": actor, "via": via}
        return bool(self._all("limits", "reset_job_type_limits", params)[0][0])
