"""What an attempt prints: captured per line, bounded, written while the job runs.

``Capture`` takes a command's raw stdout/stderr bytes (``feed``) or whole lines (``line``: a
Python handler's log records) and keeps at most ``output_max_bytes`` of them: lines go into
head chunks (``seq`` 0, 1, ...) until half the bound is used, then into a ring of
``TAIL_SLOTS`` tail slots (``seq`` -1..-4), each upserted until it holds its share of the other
half. Bytes that fit neither are counted, never kept: the newest tail slot carries the total
as ``omitted_bytes``, shown as "… N bytes omitted …" between head and tail. Raw bytes are
split into lines lazily, once per flush and only the part that can still be kept, so a
command flooding its stdout costs the daemon a memory copy per read, not Python work per
line, and never more memory than the bound.

``Flusher`` is one thread per daemon writing every active capture about once a second; the
worker thread writes the rest when the attempt ends. Every write is guarded by the claim
(worker id, attempt), as results are: a holder that lost the run cannot write into a later
attempt.
"""

from __future__ import annotations

import bisect
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from pgtick.errors import DatabaseError
from pgtick.observability.tracecontext import TraceIds
from pgtick.storage.output import Chunk, OutputQueries

FLUSH_INTERVAL_SECONDS = 1.0
TAIL_SLOTS = 4
# A line longer than this is cut into pieces of this size (a 100 MB line is not one string).
MAX_LINE_BYTES = 8192

log = structlog.get_logger("pgtick.output")

Line = tuple[int, str, str]  # (offset_ms, stream, text), stored as a JSON triple


def _text(raw: bytes) -> str:
    """Bytes as text jsonb can hold: invalid UTF-8 and NUL become U+FFFD."""
    return raw.decode("utf-8", "replace").replace("\x00", "\ufffd")


def _cut(line: Line, size: int) -> tuple[Line, int]:
    """``line`` with its text cut to fit ``size`` bytes stored (the text's UTF-8 and a line
    end), never inside a character; and the size it now takes."""
    at, stream, text = line
    kept = text.encode("utf-8")[: max(0, size - 1)].decode("utf-8", "ignore")
    return (at, stream, kept), len(kept.encode("utf-8")) + 1


@dataclass
class _Pending:
    """One stream's bytes not yet split into lines, and when each read arrived."""

    data: bytearray = field(default_factory=bytearray)
    start: int = 0  # position in the stream of data[0]
    marks: list[tuple[int, int]] = field(default_factory=list)  # (position, offset_ms)

    def time_at(self, position: int, default: int) -> int:
        i = bisect.bisect_right(self.marks, (position, 1 << 62)) - 1
        return self.marks[i][1] if i >= 0 else default

    def drop(self, n: int) -> None:
        del self.data[:n]
        self.start += n
        i = bisect.bisect_right(self.marks, (self.start, 1 << 62)) - 1
        if i > 0:
            del self.marks[:i]


class Capture:
    """One attempt's output, bounded; safe to feed from one thread while another flushes."""

    def __init__(
        self,
        run_id: int,
        attempt: int,
        job_type: str,
        started_at: datetime | None,
        max_bytes: int,
    ) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self.job_type = job_type
        self.started_at = started_at
        # Whether the handler has committed the attempt's success itself (ctx.transaction()):
        # from then on its lines are written under the ended attempt, not the held run.
        self.committed: Callable[[], bool] = lambda: False
        self.trace_ids: TraceIds | None = None  # the run's trace, for its log lines
        self.head_budget = max_bytes // 2
        self.slot_budget = max(1, (max_bytes - self.head_budget) // TAIL_SLOTS)
        self.total_bytes = 0
        self.omitted_bytes = 0
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._pending = {"stdout": _Pending(), "stderr": _Pending()}
        self._ready: list[tuple[Line, int]] = []  # split lines since the last take: head
        self._ready_tail: collections.deque[tuple[Line, int]] = collections.deque()  # the rest
        self._ready_tail_bytes = 0
        self._head_open = True
        self._head_used = 0
        self._head_seq = 0
        self._head_written = 0
        self._slots_used = 0  # tail slots started so far
        self._slot_lines: list[Line] = []
        self._slot_bytes = 0
        self._ring_bytes: list[int] = []  # bytes held by each slot, oldest first
        self._dirty: dict[int, list[Line]] = {}
        # Held by a flush from its take to its write (Flusher.flush): one at a time, each
        # written before the next is taken.
        self.writing = threading.Lock()

    def _ms(self) -> int:
        return int((time.monotonic() - self._t0) * 1000)

    # -- input --------------------------------------------------------------------------------

    def feed(self, stream: str, data: bytes) -> None:
        """Raw bytes from a command's pipe; what can no longer be kept is counted and dropped."""
        if not data:
            return
        with self._lock:
            self.total_bytes += len(data)
            p = self._pending[stream]
            p.marks.append((p.start + len(p.data), self._ms()))
            p.data += data
            if self._head_open:
                # Lines for the head are split as they come; it is bounded, so is this work.
                self._split(stream, p, final=False, head_only=True)
            keep = self.slot_budget
            if len(p.data) > 2 * keep + MAX_LINE_BYTES:  # trim in batches, not every read
                n = len(p.data) - keep
                p.drop(n)
                self.omitted_bytes += n

    def line(self, stream: str, text: str) -> None:
        """One whole line (a Python handler's log record)."""
        data = text.encode("utf-8", "replace")
        with self._lock:
            self.total_bytes += len(data) + 1
            for i in range(0, max(len(data), 1), MAX_LINE_BYTES):
                piece = data[i : i + MAX_LINE_BYTES]
                self._keep((self._ms(), stream, _text(piece)), len(piece) + 1)

    def _split(self, stream: str, p: _Pending, *, final: bool, head_only: bool = False) -> None:
        while p.data and not (head_only and not self._head_open):
            end = p.data.find(b"\n", 0, MAX_LINE_BYTES)
            if end < 0:
                if len(p.data) < MAX_LINE_BYTES and not final:
                    return  # an unfinished line waits for the rest
                end = size = min(len(p.data), MAX_LINE_BYTES)
            else:
                size = end + 1
            text = _text(bytes(p.data[:end]).rstrip(b"\r"))
            # Counted as stored: the text (invalid bytes grown to U+FFFD) and a line end, also
            # for a piece of an overlong line that had none in the stream.
            stored = len(text.encode("utf-8")) + 1
            self._keep((p.time_at(p.start, self._ms()), stream, text), stored)
            p.drop(size)

    def _keep(self, line: Line, size: int) -> None:
        if self._head_open and self._head_used + size <= self.head_budget:
            self._head_used += size
            self._ready.append((line, size))
            return
        self._head_open = False
        # Past the head, only a tail's worth waits for the next flush (a handler logging a
        # million records a second holds no more than that).
        self._ready_tail.append((line, size))
        self._ready_tail_bytes += size
        while self._ready_tail_bytes > self.slot_budget * TAIL_SLOTS and len(self._ready_tail) > 1:
            _, dropped = self._ready_tail.popleft()
            self._ready_tail_bytes -= dropped
            self.omitted_bytes += dropped

    # -- what to write ------------------------------------------------------------------------

    def take(self, final: bool) -> tuple[list[Chunk], list[Line]]:
        """The chunks to write now (head chunks, tail slots to upsert) and the new lines."""
        with self._lock:
            for stream, p in self._pending.items():
                self._split(stream, p, final=final)
            ready, self._ready = [*self._ready, *self._ready_tail], []
            self._ready_tail.clear()
            self._ready_tail_bytes = 0
            ready.sort(key=lambda item: item[0][0])
            chunks: list[Chunk] = []
            head = [line for line, _ in ready[: self._head_count(ready)]]
            if head:
                chunks.append(Chunk(self._head_seq, head, 0))
                self._head_seq += 1
            for line, size in ready[len(head) :]:
                self._to_tail(line, size)
            for seq, lines in self._dirty.items():
                chunks.append(Chunk(seq, lines, self.omitted_bytes))
            self._dirty = {}
            return chunks, [line for line, _ in ready]

    def _head_count(self, ready: list[tuple[Line, int]]) -> int:
        """How many of the ready lines still belong to the head."""
        if self._slots_used:
            return 0
        n = 0
        for _, size in ready:
            if self._head_written + size > self.head_budget:
                break
            self._head_written += size
            n += 1
        return n

    def _to_tail(self, line: Line, size: int) -> None:
        if size > self.slot_budget:
            # A line longer than a slot's share keeps its start, cut to that share: a slot
            # holding one long line whole would take the tail past the bound.
            line, kept = _cut(line, self.slot_budget)
            self.omitted_bytes += size - kept
            size = kept
        if not self._slots_used or (
            self._slot_lines and self._slot_bytes + size > self.slot_budget
        ):
            self._slots_used += 1
            self._slot_lines, self._slot_bytes = [], 0
            self._ring_bytes.append(0)
            if len(self._ring_bytes) > TAIL_SLOTS:  # the oldest slot is overwritten
                self.omitted_bytes += self._ring_bytes.pop(0)
        self._slot_lines.append(line)
        self._slot_bytes += size
        self._ring_bytes[-1] = self._slot_bytes
        seq = -((self._slots_used - 1) % TAIL_SLOTS) - 1
        self._dirty.pop(seq, None)  # written in the order last filled: the reader's order
        self._dirty[seq] = list(self._slot_lines)


LineSink = Callable[[Capture, list[Line]], None]


class Flusher:
    """Writes the active captures about once a second, each guarded by its claim."""

    def __init__(
        self, store: OutputQueries, worker_id: str, on_lines: LineSink | None = None
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._on_lines = on_lines
        self._active: dict[int, Capture] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        self._thread = threading.Thread(target=self._loop, name="pgtick-output", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        self._stop.set()

    def add(self, capture: Capture) -> None:
        with self._lock:
            self._active[id(capture)] = capture

    def finish(self, capture: Capture) -> None:
        """The attempt ended: write what is left, and forget it."""
        with self._lock:
            self._active.pop(id(capture), None)
        self.flush(capture, final=True)

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL_SECONDS):
            with self._lock:
                captures = list(self._active.values())
            for capture in captures:
                try:
                    self.flush(capture, final=False)
                except Exception:  # a bug here must not stop every other run's output
                    log.exception("output_flush_failed", run_id=capture.run_id)

    def flush(self, capture: Capture, *, final: bool) -> None:
        """Take what is new and write it. One flush of a capture at a time: a tail slot is
        upserted whole, so a periodic flush still writing when the attempt ended (its thread
        had taken the capture before ``finish``) would otherwise land after the final one and
        put an older copy of the slot back, losing the last lines."""
        with capture.writing:
            chunks, lines = capture.take(final)
            if lines and self._on_lines is not None:
                self._on_lines(capture, lines)
            if not chunks:
                return
            try:
                committed = capture.committed()
                args = (self._worker_id, capture.run_id, capture.attempt, capture.started_at)
                written = self._store.write_output(*args, chunks, committed=committed)
                if not written and not committed and capture.committed():
                    # The handler's success committed while this write was on its way.
                    self._store.write_output(*args, chunks, committed=True)
            except DatabaseError as exc:  # output is best effort; the run's outcome is not
                log.warning("output_write_failed", run_id=capture.run_id, error=str(exc))


_job_log = structlog.get_logger("pgtick.job_output")


def log_job_output(capture: Capture, lines: list[Line]) -> None:
    """Each line a command printed, also in the daemon's log (``logging.job_output``), with
    run_id, attempt, job_type and stream. Only lines kept (head and tail) are logged, so a
    flood costs the log what it costs the table. A Python handler's records (stream "log")
    are in the daemon's log already."""
    ids = capture.trace_ids
    trace = {} if ids is None else {"trace_id": ids.trace_id, "span_id": ids.span_id}
    for _, stream, text in lines:
        if stream != "log":
            _job_log.info(
                "job_output",
                run_id=capture.run_id,
                attempt=capture.attempt,
                job_type=capture.job_type,
                stream=stream,
                line=text,
                **trace,
            )
