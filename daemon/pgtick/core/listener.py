"""The LISTEN connection: an enqueue's NOTIFY wakes idle workers within milliseconds.

A dedicated connection outside the pool, to ``database.listen_dsn`` when it is set (a direct
connection when ``database.dsn`` goes through a transaction-mode pooler such as PgBouncer,
where a LISTEN never hears anything), else to the DSN. A ``!due`` NOTIFY lowers
the claim's lower bound of its type (keyset.py). NOTIFYs sent while it was disconnected
are lost, so every (re)connect is followed by a wake-up: the dispatcher's claim is the
catch-up poll; without notifications idle workers still poll every ``worker.poll_interval``.

Without ``listen_dsn`` the connection is checked first: one through a pooler (the server's
backend pid is not the one the connection was given) LISTENs to nothing, and the daemon says
once, in a ``notifications_unavailable`` warning, that it falls back to polling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from pgtick.errors import DatabaseError
from pgtick.observability.metrics import Metrics
from pgtick.storage import store
from pgtick.storage.db import retry_delay

NOTIFY_POLL_SECONDS = 1.0
RESCAN_PAYLOAD = "!rescan"  # runs were put behind the claimers' lower bounds (keyset.py)
DUE_PREFIX = "!due "  # "!due SECONDS JOB_TYPE": a run of that type due at that second
CONTROLS_PAYLOAD = "!controls"  # a job type was paused, resumed or limited (controls.py)

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
        on_rescan: Callable[[], None] | None = None,
        on_due: Callable[[str, datetime], None] | None = None,
        on_controls: Callable[[], None] | None = None,
    ) -> None:
        self._dsn = listen_dsn or dsn
        self._detect_pooler = not listen_dsn  # an explicit listen_dsn is trusted
        self._schema = schema
        self._job_types = job_types
        self._on_wake = on_wake
        self._on_rescan = on_rescan or on_wake
        self._on_due = on_due
        self._on_controls = on_controls or (lambda: None)
        self._metrics = metrics
        self.stop_event = threading.Event()
        self.alive_at = time.monotonic()
        self.connected = False

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            try:
                with store.listening(
                    self._dsn, self._schema, detect_pooler=self._detect_pooler
                ) as notifications:
                    pooled = notifications.pooled
                    if not pooled:
                        self.connected = True
                    if failures:
                        log.info("listener_reconnected", after_failures=failures)
                        self._metrics.outage.succeeded("listen")
                    failures = 0
                    if not pooled:
                        # Catch up on what was enqueued (or given back), paused or limited
                        # while we were away.
                        self._on_controls()
                        self._on_rescan()
                        self._listen(notifications)
                if pooled:
                    self._poll_only()
                    return
            except DatabaseError as exc:
                self.connected = False
                failures += 1
                self._metrics.db_error("listen")
                if not self._metrics.outage.failed("listen", exc, retry_delay(failures)):
                    log.warning("listener_failed", error=str(exc), retry_in=retry_delay(failures))
                self.stop_event.wait(retry_delay(failures))
        self.connected = False

    def _poll_only(self) -> None:
        """Said once; the loop then only waits to be stopped (idle workers poll)."""
        log.warning(
            "notifications_unavailable",
            message="notifications unavailable: database.dsn goes through a connection pooler "
            "and database.listen_dsn is not set, so idle workers find new runs by polling "
            "every worker.poll_interval; set database.listen_dsn to a direct DSN for "
            "millisecond pickup",
        )
        while not self.stop_event.wait(NOTIFY_POLL_SECONDS):
            self.alive_at = time.monotonic()

    def _listen(self, notifications: store.Notifications) -> None:
        while not self.stop_event.is_set():
            self.alive_at = time.monotonic()
            for payload in notifications.next(NOTIFY_POLL_SECONDS):
                if payload in self._job_types:
                    self._on_wake()
                elif payload == RESCAN_PAYLOAD:
                    self._on_rescan()
                elif payload == CONTROLS_PAYLOAD:
                    self._on_controls()
                elif self._on_due is not None and payload.startswith(DUE_PREFIX):
                    due = parse_due(payload)
                    if due is not None and due[0] in self._job_types:
                        self._on_due(*due)


def parse_due(payload: str) -> tuple[str, datetime] | None:
    """(job type, due time) of a ``!due SECONDS JOB_TYPE`` payload; None if malformed."""
    _, _, rest = payload.partition(" ")
    seconds, _, job_type = rest.partition(" ")
    try:
        return job_type, datetime.fromtimestamp(int(seconds), UTC)
    except (ValueError, OverflowError, OSError):
        return None
