"""The LISTEN connection: an enqueue's NOTIFY wakes idle workers within milliseconds.

A dedicated connection outside the pool, to ``database.listen_dsn`` when it is set (a direct
connection when ``database.dsn`` goes through a transaction-mode pooler such as PgBouncer,
where a LISTEN never hears anything), else to the DSN. NOTIFYs sent while it was disconnected
are lost, so every (re)connect is followed by a wake-up: the dispatcher's claim is the
catch-up poll; without notifications idle workers still poll every ``worker.poll_interval``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage import store
from pgtick.storage.db import retry_delay

NOTIFY_POLL_SECONDS = 1.0

log = structlog.get_logger("pgtick.listener")


class Listener:
    """Calls ``on_wake`` for every NOTIFY about a job type this daemon handles."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        job_types: set[str],
        on_wake: Callable[[], None],
        metrics: Metrics,
        *,
        listen_dsn: str = "",
    ) -> None:
        self._dsn = listen_dsn or dsn
        self._schema = schema
        self._job_types = job_types
        self._on_wake = on_wake
        self._metrics = metrics
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.connected = False

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            try:
                with store.listening(self._dsn, self._schema) as notifications:
                    self.connected = True
                    if failures:
                        log.info("listener_reconnected", after_failures=failures)
                    failures = 0
                    self._on_wake()  # catch up on what was enqueued while we were away
                    self._listen(notifications)
            except DatabaseError as exc:
                self.connected = False
                failures += 1
                self._metrics.db_error("listen")
                log.warning("listener_failed", error=str(exc), retry_in=retry_delay(failures))
                self.stop_event.wait(retry_delay(failures))
        self.connected = False

    def _listen(self, notifications: store.Notifications) -> None:
        while not self.stop_event.is_set():
            self.alive_at = time.monotonic()
            for payload in notifications.next(NOTIFY_POLL_SECONDS):
                if payload in self._job_types:
                    self._on_wake()
