"""Progress of a long operation (``pgtick prune``, ``pgtick migrate``'s copy): rows done, rate
and time left, reported at most once per period and once at the end.

Every report is a ``progress`` log event (the daemon's JSON log; the CLI's log with
``--debug``); on a terminal it is also one line rewritten in place on the given stream, so an
operator watching a prune of millions of rows sees how far it is. Nothing is written to a
stream that is not a terminal (a pipe or a file gets the log only)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

import structlog

log = structlog.get_logger("pgtick.progress")

REPORT_EVERY_SECONDS = 1.0


def _count(n: float) -> str:
    return f"{round(n):,}".replace(",", " ")


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Counts rows of ``what`` done out of ``total`` (None: unknown, no time left shown)."""

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        stream: TextIO | None = None,
        every: float = REPORT_EVERY_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self._tty = stream if stream is not None and stream.isatty() else None
        self._every = every
        self._clock = clock
        self._started = clock()
        self._last_report = self._started

    @property
    def rate(self) -> float:
        """Rows per second so far (0 before the first row)."""
        elapsed = self._clock() - self._started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def seconds_left(self) -> float | None:
        """At the rate so far; None while unknown (no total, or no rate yet)."""
        if self.total is None or self.rate <= 0:
            return None
        return max(0, self.total - self.done) / self.rate

    def line(self) -> str:
        """``prune succeeded: 12 000 of 50 000 rows (24%), 4 000 rows/s, 9s left``."""
        done = _count(self.done)
        if self.total is None:
            text = f"{self.what}: {done} rows"
        else:
            share = 100 * self.done // self.total if self.total else 100
            text = f"{self.what}: {done} of {_count(self.total)} rows ({share}%)"
        text += f", {_count(self.rate)} rows/s"
        left = self.seconds_left
        if left is not None and self.done < (self.total or 0):
            text += f", {_duration(left)} left"
        return text

    def advance(self, rows: int) -> None:
        """Count ``rows`` more; report if the period has passed since the last report (and
        something was done)."""
        self.done += rows
        now = self._clock()
        if self.done and now - self._last_report >= self._every:
            self._last_report = now
            self._report(final=False)

    def finish(self) -> None:
        """The closing report, unless nothing was done."""
        if self.done:
            self._report(final=True)

    def _report(self, *, final: bool) -> None:
        left = self.seconds_left
        log.info(
            "progress",
            what=self.what,
            done=self.done,
            total=self.total,
            rate=round(self.rate, 1),
            seconds_left=None if final or left is None else round(left, 1),
            final=final,
        )
        if self._tty is not None:
            self._tty.write("\r\x1b[K" + self.line() + ("\n" if final else ""))
            self._tty.flush()
