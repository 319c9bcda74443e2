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
        self._read_once = False
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read the items again if they are older than ATTENTION_SECONDS. Called before a
        page's read transaction. The first read is waited for; after it a stale read runs on a
        thread of its own while the page shows the items there are (at most ATTENTION_SECONDS
        and one read old), so no page waits for `status`'s read (60-90 ms at 1 M runs, some
        of it on two connections) and one read runs at a time."""
        if time.monotonic() - self._read_at < ATTENTION_SECONDS:
            return
        if not self._lock.acquire(blocking=False):
            return
        if not self._read_once:
            self._read()
            return
        threading.Thread(target=self._read, name="pgtick-console-attention", daemon=True).start()

    def _read(self) -> None:
        """One read of the items; the caller holds ``_lock``, which this releases."""
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
            self._read_once = True
            self._lock.release()
