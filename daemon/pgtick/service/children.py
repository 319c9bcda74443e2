"""The supervisor's worker processes: started with multiprocessing's "spawn" context, watched
through their sentinels and pipes on one thread, restarted with back-off, drained together.

A worker process that dies (SIGKILL, a segfault in a C extension, the OOM killer) makes its
sentinel readable at once: this thread joins it, has its runs recovered by its worker id
(``on_death``: the reaper's ``reap_holder``, not waiting for their leases) and starts a
successor after a back-off that doubles while processes keep dying young. A process that
asks to be recycled gets its successor at once and drains beside it.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import structlog

from pgtick.core import handlers
from pgtick.observability.metrics import Metrics
from pgtick.service import child
from pgtick.service.child import ChildSpec

RESTART_MIN_SECONDS = 0.5
RESTART_MAX_SECONDS = 30.0
HEALTHY_AFTER_SECONDS = 60.0  # a process that lived this long restarts without back-off
WATCH_SECONDS = 0.5  # the watching thread's longest wait when nothing happens
KILL_JOIN_SECONDS = 5.0
# A dead process's run whose row was locked at its death (its own open ctx.transaction(), until
# the server notices the connection gone and rolls back) was skipped: looked for again then.
REAP_AGAIN_SECONDS = 1.0
# A process's status (sent every second) younger than this says it is alive (idle_worker_ids).
STATUS_FRESH_SECONDS = 3.0

log = structlog.get_logger("pgtick.service")


@dataclass(eq=False)
class Child:
    """One worker process as the supervisor sees it."""

    slot: int
    worker_id: str
    process: BaseProcess
    conn: Connection
    started_at: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    ready: bool = False
    retiring: bool = False  # recycled: its exit is expected, its slot has a successor
    busy: int = 0
    claimed: int = 0
    finished: int = 0
    leased: int = -1  # runs it holds a lease on, as of its last status (-1: none came yet)
    status_at: float = -math.inf  # monotonic: when its last status came
    problem: str | None = None

    def send(self, *message: Any) -> None:
        # Gone: its sentinel tells the watcher.
        with self.lock, contextlib.suppress(OSError, ValueError):
            self.conn.send(message)


def new_worker_id(slot: int) -> str:
    """Host, the supervisor's pid and the slot, and a random suffix (one per incarnation)."""
    return f"{handlers.hostname()}:{os.getpid()}.{slot}:{secrets.token_hex(3)}"


class Children:
    """``count`` slots, each with at most one live process (plus recycled ones draining)."""

    def __init__(
        self,
        count: int,
        spec_for: Callable[[int, str], ChildSpec],
        metrics: Metrics,
        on_death: Callable[[str], object],
    ) -> None:
        self._ctx = multiprocessing.get_context("spawn")
        self._count = count
        self._spec_for = spec_for
        self._metrics = metrics
        self._on_death = on_death
        self._lock = threading.Lock()
        self._slots: dict[int, Child | None] = dict.fromkeys(range(1, count + 1))
        self._retiring: list[Child] = []
        self._failures: dict[int, int] = dict.fromkeys(range(1, count + 1), 0)
        self._restart_at: dict[int, float] = {}
        self._reap_again: dict[str, float] = {}  # worker id -> when to recover its runs again
        self._stopping = False
        self._gone = threading.Event()
        self._next = 0  # round-robin position of wake-ups
        self._listening = False
        self.exit_codes: list[int] = []  # of processes that ended while stopping
        self.died = 0  # processes that ended unasked
        # Watched by the supervisor like a side loop: if it dies, no death would be seen.
        self.thread = threading.Thread(target=self._watch, name="pgtick-children", daemon=True)

    # -- starting and watching -----------------------------------------------------------------

    def start(self) -> None:
        for slot in self._slots:
            self._spawn(slot)
        self.thread.start()

    def _spawn(self, slot: int) -> Child:
        worker_id = new_worker_id(slot)
        mine, theirs = self._ctx.Pipe()
        process = self._ctx.Process(
            target=child.main,
            args=(self._spec_for(slot, worker_id), theirs),
            name=f"pgtick-worker-{slot}",
            daemon=True,
        )
        process.start()
        theirs.close()  # the child's end: its death then reads as the end of the pipe
        c = Child(slot, worker_id, process, mine, time.monotonic())
        with self._lock:
            self._slots[slot] = c
        c.send("listening", self._listening)
        if self._stopping:  # the drain began while it was being started
            c.send("drain")
        log.info("worker_process_spawned", slot=slot, pid=process.pid, worker_id=worker_id)
        return c

    def _live(self) -> list[Child]:
        with self._lock:
            return [c for c in self._slots.values() if c is not None] + list(self._retiring)

    def _watch(self) -> None:
        while True:
            live = self._live()
            if self._stopping and not live:
                for worker_id in list(self._reap_again):
                    del self._reap_again[worker_id]
                    self._recover(worker_id)  # once more, not waiting for the second
                self._gone.set()
                return
            timeout = WATCH_SECONDS
            due = [*self._reap_again.values()]
            if not self._stopping:
                due += self._restart_at.values()
            if due:
                timeout = max(0.0, min(timeout, min(due) - time.monotonic()))
            by_handle: dict[Any, Child] = {}
            for c in live:
                by_handle[c.conn] = c
                by_handle[c.process.sentinel] = c
            for handle in wait(list(by_handle), timeout):
                c = by_handle[handle]
                if handle is c.conn:
                    self._read(c)
                elif c in self._live():
                    self._ended(c)
            self._restart_due()
            self._recover_again()

    def _recover_again(self) -> None:
        now = time.monotonic()
        for worker_id, at in list(self._reap_again.items()):
            if at <= now:
                del self._reap_again[worker_id]
                self._recover(worker_id)

    def _recover(self, worker_id: str) -> None:
        """Whatever ``worker_id`` still holds, recovered by claim now (``on_death``)."""
        try:
            self._on_death(worker_id)
        except Exception as exc:  # a database away: the reaper takes them after the lease
            log.warning("worker_process_runs_not_recovered", worker_id=worker_id, error=str(exc))

    def _read(self, c: Child) -> None:
        try:
            while c.conn.poll():
                self._message(c, c.conn.recv())
        except (EOFError, OSError):
            pass  # its sentinel follows

    def _message(self, c: Child, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            c.ready = True
        elif kind == "status":
            c.busy, c.claimed, c.finished, c.leased = message[1:5]
            c.status_at = time.monotonic()
        elif kind == "backlog":
            self.wake(besides=c)
        elif kind == "problem":
            c.problem = str(message[1])
        elif kind == "recycle" and not c.retiring and not self._stopping:
            log.info("worker_process_recycled", slot=c.slot, pid=c.process.pid, reason=message[1])
            with self._lock:
                c.retiring = True
                self._retiring.append(c)
                self._slots[c.slot] = None
            self._spawn(c.slot)

    def _ended(self, c: Child) -> None:
        """A process ended: joined, its live gauges dropped, its runs recovered, and (unless
        stopping, or recycled) a successor due after the back-off."""
        c.process.join(KILL_JOIN_SECONDS)
        code = c.process.exitcode
        pid = c.process.pid
        with self._lock:
            if c in self._retiring:
                self._retiring.remove(c)
            if self._slots.get(c.slot) is c:
                self._slots[c.slot] = None
        c.conn.close()
        if pid is not None:
            self._metrics.process_gone(pid)
        expected = c.retiring or self._stopping
        if self._stopping:
            self.exit_codes.append(code if code is not None else 1)
        fields = {"slot": c.slot, "pid": pid, "worker_id": c.worker_id, "exit_code": code}
        if code is not None and code < 0:
            fields["signal"] = _signal_name(-code)
        if expected and code == 0:
            log.info("worker_process_exited", **fields)
        else:
            self.died += 0 if expected else 1
            log.error("worker_process_died", **fields, lived_seconds=round(self._age(c), 3))
        self._recover(c.worker_id)  # whatever it still held, by claim, now
        if not (expected and code == 0):
            self._reap_again[c.worker_id] = time.monotonic() + REAP_AGAIN_SECONDS
        if expected:
            return
        failures = 0 if self._age(c) >= HEALTHY_AFTER_SECONDS else self._failures[c.slot] + 1
        self._failures[c.slot] = failures
        delay = min(RESTART_MAX_SECONDS, RESTART_MIN_SECONDS * 2 ** max(0, failures - 1))
        self._restart_at[c.slot] = time.monotonic() + delay
        log.info("worker_process_restarting", slot=c.slot, in_seconds=delay)

    @staticmethod
    def _age(c: Child) -> float:
        return time.monotonic() - c.started_at

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot, at in list(self._restart_at.items()):
            if self._stopping:
                self._restart_at.clear()
                return
            if at <= now:
                del self._restart_at[slot]
                self._spawn(slot)

    # -- what the supervisor asks --------------------------------------------------------------

    def all_ready(self) -> bool:
        with self._lock:
            return all(c is not None and c.ready for c in self._slots.values())

    def problem(self) -> str | None:
        """Why the worker processes are not all ready, for /readyz (None: they are)."""
        with self._lock:
            slots = list(self._slots.items())
        for slot, c in slots:
            if c is None:
                return f"worker process {slot} not running (restarting)"
            if c.problem is not None:
                return f"worker process {slot}: {c.problem}"
            if not c.ready:
                return f"worker process {slot} starting"
        return None

    def status(self, threads: int) -> str:
        live = self._live()
        busy = sum(c.busy for c in live)
        claimed = sum(c.claimed for c in live)
        return (
            f"{busy}/{threads * self._count} busy in {len(live)} processes, {claimed} runs claimed"
        )

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._live() if c.process.pid is not None]

    def idle_worker_ids(self) -> list[str]:
        """The worker ids of the processes that hold no run and said so within
        STATUS_FRESH_SECONDS: alive, and not beating for themselves (service/beats.py). A
        process that stopped talking (frozen, dying) is left to its own beats, and then to
        the reapers."""
        now = time.monotonic()
        return [
            c.worker_id
            for c in self._live()
            if c.leased == 0 and now - c.status_at < STATUS_FRESH_SECONDS
        ]

    def ask_beat(self, worker_id: str) -> None:
        """Have the process ``worker_id`` beat for itself now (its workers row has gone)."""
        for c in self._live():
            if c.worker_id == worker_id:
                c.send("beat")

    # -- NOTIFYs relayed from the supervisor's LISTEN connection --------------------------------

    def _ready(self) -> list[Child]:
        with self._lock:
            return [c for c in self._slots.values() if c is not None and c.ready]

    def _one(self, besides: Child | None = None) -> Child | None:
        """The next ready process, round-robin: one NOTIFY wakes one process, not all."""
        ready = [c for c in self._ready() if c is not besides]
        if not ready:
            return None
        self._next = (self._next + 1) % len(ready)
        return ready[self._next]

    def wake(self, besides: Child | None = None) -> None:
        """Wake one process (a NOTIFY; or another than ``besides``, whose claim came back
        full)."""
        c = self._one(besides)
        if c is not None:
            c.send("wake")

    def due(self, job_type: str, run_at: Any) -> None:
        """A ``!due``: every process lowers its bound (keyset.py) and none is woken by it: the
        job type's NOTIFY sent right after it (enqueue(), storage.runs.announce) wakes one."""
        for c in self._ready():
            c.send("bound", job_type, run_at.timestamp())

    def rescan(self) -> None:
        for c in self._ready():
            c.send("rescan")

    def controls(self) -> None:
        for c in self._ready():
            c.send("controls")

    def listening(self, connected: bool) -> None:
        """Whether the LISTEN connection relays NOTIFYs, told every round of the main loop:
        the processes' claims wait accordingly, and a process that stops hearing it (this
        supervisor stopped or hung) claims by its poll interval again (child.RELAY_STALE)."""
        self._listening = connected
        for c in self._live():
            c.send("listening", connected)

    # -- stopping ------------------------------------------------------------------------------

    def drain(self, force: threading.Event, deadline_seconds: float) -> None:
        """Every process drains (``force``: the second SIGTERM, passed on); past the
        deadline the ones left are killed (their runs recovered as after a death)."""
        self._stopping = True
        self._restart_at.clear()
        for c in self._live():
            c.send("drain")
        forced = False
        deadline = time.monotonic() + deadline_seconds
        while not self._gone.wait(0.05):
            if force.is_set() and not forced:
                forced = True
                for c in self._live():
                    c.send("force")
            if time.monotonic() > deadline:
                for c in self._live():
                    log.error("worker_process_killed", slot=c.slot, pid=c.process.pid)
                    c.process.kill()
                self._gone.wait(KILL_JOIN_SECONDS)
                break
        self.thread.join(KILL_JOIN_SECONDS)


def _signal_name(signum: int) -> str:
    import signal

    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)
