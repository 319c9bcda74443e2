"""What exists once per daemon whatever ``worker.processes`` says: the ticker (schedules) and
the reaper (expired leases, retention); and the start-up steps they take before the first
claim.
"""

from __future__ import annotations

import structlog

from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.reaper import Reaper
from pgtick.core.ticker import Ticker
from pgtick.observability.metrics import Metrics
from pgtick.service.loops import LoopThread
from pgtick.storage.store import RunStore

log = structlog.get_logger("pgtick.service")


class OnceSide:
    """The ticker and the reaper of one daemon, on ``store``."""

    def __init__(
        self,
        config: Config,
        store: RunStore,
        job_types: dict[str, handlers.JobType],
        metrics: Metrics,
    ) -> None:
        cfg = config
        self.store = store
        self.reaper = Reaper(
            store,
            job_types,
            cfg.ticker.reaper_interval_seconds,
            cfg.worker.heartbeat_seconds,
            cfg.retention,
            metrics,
        )
        self._priorities = {name: jt.config.priority for name, jt in job_types.items()}
        self._follows = {name: jt.config.follow for name, jt in job_types.items()}
        self.ticker = Ticker(
            store,
            list(cfg.schedules.values()),
            sorted(job_types),
            cfg.ticker,
            metrics,
            priorities=self._priorities,
            service=cfg.worker.service,
        )

    def prepare(self) -> None:
        """Before the first claim: the job types' settings, the partitions finished runs go
        to (the reaper's retention passes keep them ahead from here on), the schedules synced
        and the first tick done (READY=1 means it is)."""
        self.store.sync_job_type_settings(self._priorities, self._follows)
        self.reaper.prune_once()
        self.ticker.sync()
        self.ticker.tick()

    def loops(self) -> list[LoopThread]:
        return [LoopThread("reaper", self.reaper.run), LoopThread("ticker", self.ticker.run)]

    def stop(self) -> None:
        self.reaper.stop_event.set()
        self.ticker.stop_event.set()

    def last_tick_at(self) -> float | None:
        return self.ticker.last_tick_at
