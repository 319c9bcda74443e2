"""The attention banner's items: the problems of ``operations.status``, the very function
behind `pgtick status`'s ATTENTION lines (so the two cannot disagree), read at most every
``ATTENTION_SECONDS`` for every page and live update of the console together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import structlog

from pgtick.errors import PgtickError
from pgtick.storage.store import ClaimType, RunStore
from pgtick.surfaces import operations

# How old the banner's items may be (several browsers polling cost one read a second).
ATTENTION_SECONDS = 1.0

log = structlog.get_logger("pgtick.console")


class Attention:
    """The last items read (None: the database did not answer in time) and when."""

    def __init__(
        self,
        store: RunStore,
        *,
        heartbeat_seconds: float,
        tick_interval_seconds: float,
        limits: Sequence[ClaimType],
        horizon_threshold_seconds: float = operations.DEFAULT_HORIZON_THRESHOLD_SECONDS,
        timeout_seconds: float,
        pool_timeout_seconds: float,
    ) -> None:
        self.store = store
        self.heartbeat_seconds = heartbeat_seconds
        self.tick_interval_seconds = tick_interval_seconds
        self.limits = tuple(limits)
        # web.horizon_threshold: the same as `status --horizon-threshold` gives the same items.
        self.horizon_threshold_seconds = horizon_threshold_seconds
        self.timeout_seconds = timeout_seconds
        self.pool_timeout_seconds = pool_timeout_seconds
        self.items: tuple[str, ...] | None = None
        self._read_at = -ATTENTION_SECONDS
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the items again if they are older than ATTENTION_SECONDS. Called before a
        page's read transaction (this read takes connections of its own); one request reads
        while the others use what is there."""
        if time.monotonic() - self._read_at < ATTENTION_SECONDS:
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            with self.store.reading(
                "console_attention",
                statement_timeout_seconds=self.timeout_seconds,
                pool_timeout_seconds=self.pool_timeout_seconds,
            ) as store:
                st = operations.status(
                    store,
                    heartbeat_seconds=self.heartbeat_seconds,
                    tick_interval_seconds=self.tick_interval_seconds,
                    limits=self.limits,
                    horizon_threshold_seconds=self.horizon_threshold_seconds,
                    timeout_seconds=self.timeout_seconds,
                )
            self.items = tuple(st.problems)
        except PgtickError as exc:
            log.warning("console_attention_failed", error=str(exc))
            self.items = None
        finally:
            self._read_at = time.monotonic()
            self._lock.release()
