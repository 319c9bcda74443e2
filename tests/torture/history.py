"""The history: what happened, as each process saw it, in append-only JSON-lines files.

Every process that acts or observes writes its own file in the run's history directory: the
harness's clients and nemesis (``harness-*.jsonl``), each daemon's handlers
(``handlers-<pid>.jsonl``), each command handler (``cmd-<pid>.jsonl``), the observer. A line is
one event, shaped as Jepsen's operations are: who (``process``), what (``f``), ``type``
``invoke`` when it begins and ``ok`` / ``fail`` / ``info`` when it ends (``info``: the outcome
is unknown, as a COMMIT whose connection broke), and a ``value``. ``t`` is ``time.time_ns()``:
every process runs on this host, so times compare across files.

A line is written with one ``write(2)`` on a file opened O_APPEND, then fsync'ed: a SIGKILL
loses at most the line in flight, and the reader drops a last line cut short. Nothing here
goes through the database under test.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)
# Where a daemon's handlers and its commands find the history directory.
HISTORY_ENV = "TORTURE_HISTORY"
# The name of the daemon incarnation a handler runs in (d0#1: slot 0, first start).
DAEMON_ENV = "TORTURE_DAEMON"
# An ended attempt as the observer and the final state write it (a list, in this order).
ATTEMPT_FIELDS = ("run", "attempt", "worker", "outcome", "error_type", "error", "finished")
ATTEMPTS_COLUMNS = """run_id, attempt, worker_id, outcome, error_type, left(error, 200),
       (extract(epoch FROM finished_at) * 1e9)::bigint"""


@dataclass(frozen=True)
class Event:
    """One line of the history; ``source`` is ``file:line`` (set when read back)."""

    t: int
    process: str
    type: str
    f: str
    value: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def get(self, key: str, default: Any = None) -> Any:
        return self.value.get(key, default)

    def to_json(self) -> str:
        return json.dumps(
            {
                "t": self.t,
                "process": self.process,
                "type": self.type,
                "f": self.f,
                "value": self.value,
            },
            separators=(",", ":"),
            sort_keys=True,
            default=str,
        )


class HistoryFile:
    """One process's (or one thread's) append-only file; safe to share between threads."""

    def __init__(self, path: Path, process: str, *, sync: bool = True) -> None:
        self.path = path
        self.process = process
        self.sync = sync
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(
        self,
        type_: str,
        f: str,
        value: Mapping[str, Any] | None = None,
        *,
        process: str | None = None,
    ) -> Event:
        """Append one event now (as ``process``: a client thread of the harness); returns it."""
        event = Event(time.time_ns(), process or self.process, type_, f, dict(value or {}))
        line = (event.to_json() + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
            if self.sync:
                os.fsync(self._fd)
        return event

    def close(self) -> None:
        with self._lock:
            os.close(self._fd)


def parse_lines(name: str, text: str) -> Iterator[Event]:
    """The events of one file's text; a last line without its newline was cut by a kill and is
    dropped, as is a line that is not JSON (never written whole)."""
    lines = text.split("\n")
    for number, line in enumerate(lines[:-1], start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        yield Event(
            int(raw["t"]),
            str(raw["process"]),
            str(raw["type"]),
            str(raw["f"]),
            raw.get("value") or {},
            f"{name}:{number}",
        )


def read_directory(directory: Path) -> list[Event]:
    """Every event of every ``*.jsonl`` file, in time order (ties: by file and line)."""
    events: list[Event] = []
    for path in sorted(directory.glob("*.jsonl")):
        events.extend(parse_lines(path.name, path.read_text(errors="replace")))
    return sort_events(events)


def sort_events(events: Iterable[Event]) -> list[Event]:
    def key(e: Event) -> tuple[int, str, int]:
        name, _, line = e.source.rpartition(":")
        return (e.t, name, int(line) if line.isdigit() else 0)

    return sorted(events, key=key)
