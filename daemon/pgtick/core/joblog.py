"""A Python handler's output: the log records it emits, routed into its attempt's capture.

``LogCapture`` is one handler on the root logger. A record belongs to an attempt when it is
logged from the thread running the handler, or (from any other thread, such as threads the
handler started) when it carries the attempt's ``run_id`` and ``attempt``, as every record
logged through ``ctx.log`` does. Records of pgtick's own loggers are the daemon's, not the
job's (``pgtick.job``, the logger behind ``ctx.log``, excepted). A capture is made on the
first record only, so a handler that logs nothing costs a dictionary entry per run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pgtick.core.output import Capture, Flusher

_SKIP_KEYS = frozenset(
    {
        "event",
        "run_id",
        "job_type",
        "attempt",
        "logger",
        "level",
        "timestamp",
        "_record",
        "_from_structlog",
        "logger_name",
    }
)


# Taken only to make a slot's capture, on its first record: one lock for every slot, rather
# than a lock made per run for the few runs that log.
_make_lock = threading.Lock()


class _Slot:
    """One running Python attempt: where its records go once it logs something."""

    __slots__ = ("_flusher", "_make", "capture")

    def __init__(self, make: Callable[[], Capture], flusher: Flusher) -> None:
        self._make = make
        self._flusher = flusher
        self.capture: Capture | None = None

    def get(self) -> Capture:
        capture = self.capture
        if capture is not None:
            return capture
        with _make_lock:
            if self.capture is None:
                self.capture = self._make()
                self._flusher.add(self.capture)
            return self.capture


def _text(record: logging.LogRecord) -> str:
    msg: Any = record.msg
    if isinstance(msg, dict):  # a structlog event dict (ProcessorFormatter.wrap_for_formatter)
        extra = " ".join(f"{k}={v}" for k, v in msg.items() if k not in _SKIP_KEYS)
        text = f"{msg.get('event', '')} {extra}".rstrip()
    else:
        text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        text = f"{text} ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
    return f"{record.levelname.lower()} {text}"


class LogCapture(logging.Handler):
    """Routes records of running Python handlers into their captures."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._local = threading.local()
        self._by_run: dict[tuple[int, int], _Slot] = {}

    def enter(self, run_id: int, attempt: int, slot: _Slot) -> None:
        self._local.slot = slot
        self._by_run[(run_id, attempt)] = slot

    def leave(self, run_id: int, attempt: int) -> Capture | None:
        slot: _Slot | None = getattr(self._local, "slot", None)
        self._local.slot = None
        self._by_run.pop((run_id, attempt), None)
        return None if slot is None else slot.capture

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("pgtick") and record.name != "pgtick.job":
            return
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None:
            msg: Any = record.msg
            if not isinstance(msg, dict) or not self._by_run:
                return
            try:
                slot = self._by_run.get((int(msg["run_id"]), int(msg["attempt"])))
            except (KeyError, TypeError, ValueError):
                return
            if slot is None:
                return
        try:
            slot.get().line("log", _text(record))
        except Exception:  # a capture must never break a handler's logging
            self.handleError(record)


_installed: LogCapture | None = None
_install_lock = threading.Lock()


def log_capture() -> LogCapture:
    """The one LogCapture, on the root logger (added once, kept across reconfiguration).
    Called for every run: once installed, no lock is taken."""
    global _installed
    installed = _installed
    if installed is not None and installed in logging.getLogger().handlers:
        return installed
    with _install_lock:
        if _installed is None:
            _installed = LogCapture()
        root = logging.getLogger()
        if _installed not in root.handlers:
            root.addHandler(_installed)
        return _installed


def slot(make: Callable[[], Capture], flusher: Flusher) -> _Slot:
    return _Slot(make, flusher)
