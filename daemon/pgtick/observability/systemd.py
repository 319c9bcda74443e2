"""sd_notify without libsystemd: one datagram per message to ``$NOTIFY_SOCKET``.

The protocol is newline-separated ``KEY=value`` lines sent over an ``AF_UNIX``/``SOCK_DGRAM``
socket whose address systemd puts in ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace). Notification is best effort: a missing or dead socket is logged at debug level and
otherwise ignored, because losing a status line must never take the daemon down.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping

import structlog

# A notify socket whose reader is stuck must not stall the caller (the watchdog loop) forever.
SEND_TIMEOUT_SECONDS = 1.0
MICROSECONDS_PER_SECOND = 1_000_000

log = structlog.get_logger("pgtick.systemd")


def _socket_address(value: str) -> bytes | None:
    """Translate ``$NOTIFY_SOCKET`` into a ``sendto`` address; None if unusable."""
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    if value.startswith("/"):
        return os.fsencode(value)
    return None


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds, as sd_watchdog_enabled(3) recommends."""
    raw_usec = env.get("WATCHDOG_USEC", "")
    try:
        usec = int(raw_usec)
    except ValueError:
        return None
    if usec <= 0:
        return None
    raw_pid = env.get("WATCHDOG_PID")
    if raw_pid:
        try:
            pid = int(raw_pid)
        except ValueError:
            return None
        if pid != os.getpid():
            return None
    return usec / MICROSECONDS_PER_SECOND / 2


def _one_line(text: str) -> str:
    """A STATUS= value must stay on one line or systemd reads the rest as new keys."""
    return " ".join(text.splitlines()).strip()


class Notifier:
    """Talks to systemd's notify socket; every method is a no-op when not under systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        environ = os.environ if env is None else env
        raw_address = environ.get("NOTIFY_SOCKET", "")
        self._address = _socket_address(raw_address)
        if raw_address and self._address is None:
            log.debug("sd_notify_socket_unsupported", notify_socket=raw_address)
        self.enabled: bool = self._address is not None
        self.watchdog_interval_seconds: float | None = (
            _watchdog_interval(environ) if self.enabled else None
        )
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()

    def notify(self, *lines: str) -> None:
        """Send one datagram of ``KEY=value`` lines; failures are logged, never raised."""
        if not lines:
            return
        payload = "\n".join(lines).encode("utf-8")
        with self._lock:
            if not self.enabled or self._address is None:
                return
            try:
                if self._socket is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    sock.settimeout(SEND_TIMEOUT_SECONDS)
                    self._socket = sock
                self._socket.sendto(payload, self._address)
            except OSError as exc:
                log.debug("sd_notify_failed", error=str(exc), key=lines[0].partition("=")[0])

    def ready(self, status: str | None = None) -> None:
        """Tell systemd start-up is complete (``Type=notify``)."""
        self.notify("READY=1", *self._status_lines(status))

    def status(self, text: str) -> None:
        """Publish the one-line summary shown by ``systemctl status``."""
        self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self) -> None:
        """Keep-alive ping; sent only when systemd armed a watchdog for this process."""
        if self.watchdog_interval_seconds is not None:
            self.notify("WATCHDOG=1")

    def stopping(self, status: str | None = None) -> None:
        """Tell systemd the shutdown it sees is deliberate."""
        self.notify("STOPPING=1", *self._status_lines(status))

    def close(self) -> None:
        """Release the socket; later notifications are dropped."""
        with self._lock:
            self.enabled = False
            if self._socket is not None:
                self._socket.close()
                self._socket = None

    @staticmethod
    def _status_lines(status: str | None) -> tuple[str, ...]:
        return () if status is None else (f"STATUS={_one_line(status)}",)
