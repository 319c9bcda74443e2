"""The LISTEN connection: an enqueue's NOTIFY wakes idle workers within milliseconds.

A dedicated connection outside the pool (``database.listen_dsn``, or the DSN). NOTIFYs sent
while it was disconnected are lost, so every (re)connect is followed by a wake-up: the
dispatcher's claim is the catch-up poll. After connecting, the listener checks that a NOTIFY
really comes back to it: behind a transaction-mode pooler (PgBouncer) it does not, because
the LISTEN ran on one server connection and nothing is delivered between transactions. Then
it says so once, closes the connection and leaves the waking to the dispatcher's polling
(``worker.poll_interval``) for the rest of the daemon's life.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

import structlog

from pgtick import store
from pgtick.db import retry_delay
from pgtick.errors import DatabaseError
from pgtick.metrics import Metrics

NOTIFY_POLL_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 2.0  # a NOTIFY to ourselves comes back within milliseconds when it can

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
        self._dsn = dsn
        self._listen_dsn = listen_dsn or dsn
        self._schema = schema
        self._job_types = job_types
        self._on_wake = on_wake
        self._metrics = metrics
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.connected = False
        self.polling = False  # notifications do not arrive: the dispatcher's polling wakes it

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            if self.polling:
                self.alive_at = time.monotonic()
                self.stop_event.wait(NOTIFY_POLL_SECONDS)
                continue
            try:
                with store.listening(self._listen_dsn, self._schema) as notifications:
                    if not self._delivers(notifications):
                        self.polling = True
                        log.warning(
                            "notifications_unavailable",
                            message="a NOTIFY did not come back on the LISTEN connection "
                            "(a transaction-mode pooler such as PgBouncer?): idle workers "
                            "poll every worker.poll_interval instead; set database.listen_dsn "
                            "to a direct connection for instant pickup",
                        )
                        continue
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

    def _delivers(self, notifications: store.Notifications) -> bool:
        """Whether a NOTIFY sent on the daemon's DSN (as enqueues send them) reaches this
        connection."""
        probe = f"pgtick-listen-probe-{secrets.token_hex(8)}"
        store.notify_once(self._dsn, self._schema, probe)
        deadline = time.monotonic() + PROBE_TIMEOUT_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            payloads = notifications.next(left)
            if probe in payloads:
                return True
            if any(p in self._job_types for p in payloads):
                self._on_wake()
        return False

    def _listen(self, notifications: store.Notifications) -> None:
        while not self.stop_event.is_set():
            self.alive_at = time.monotonic()
            for payload in notifications.next(NOTIFY_POLL_SECONDS):
                if payload in self._job_types:
                    self._on_wake()
