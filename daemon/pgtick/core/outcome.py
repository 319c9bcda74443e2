"""What became of one attempt (``Outcome``), for the lifecycle to judge and the completer to
record, and the texts it keeps: an error a line long, a detail (traceback, stderr tail) of at
most ``DETAIL_MAX_BYTES``, both text a database column takes.
"""

from __future__ import annotations

from dataclasses import dataclass

LAST_ERROR_MAX_CHARS = 500
DETAIL_MAX_BYTES = 8192  # the traceback or stderr tail kept in the attempt row


@dataclass(frozen=True)
class Outcome:
    """What became of one attempt, for the completer to record."""

    run_id: int
    # succeeded | failed | dead: what the handler did (the lifecycle decides what is
    # written); lost: transaction() found the lease gone; interrupted: a command killed
    # because its run was cancelled (by the drain, a lost lease or an operator); cancelled:
    # set by the lifecycle, not a handler: let go of a run an operator cancelled; timed_out:
    # set by the worker, not a handler: a note on a run still held past its timeout.
    kind: str
    error: str = ""
    error_type: str = ""
    detail: str = ""
    retry_in_seconds: float | None = None
    # succeeded: what the handler returned, as JSON text (None: nothing); storage/results.py.
    result: str | None = None


# A retry asked for further ahead than this is made this far ahead: the database's timestamps
# end in the year 294276, and a result it cannot store held up every result after it.
MAX_RETRY_DELAY_SECONDS = 10 * 365 * 86400.0


def storable(text: str) -> str:
    """Text a database text column takes: NUL becomes U+FFFD, and what is not valid Unicode
    (a lone surrogate, from a file name decoded with os.fsdecode) a backslash escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\ufffd")


def short(text: str) -> str:
    """One line of at most ``LAST_ERROR_MAX_CHARS``, as a run's ``last_error`` shows it."""
    text = " ".join(text.split())
    return text if len(text) <= LAST_ERROR_MAX_CHARS else text[: LAST_ERROR_MAX_CHARS - 1] + "…"


def bounded(text: str, limit: int = DETAIL_MAX_BYTES) -> str:
    """At most ``limit`` bytes: the start (where it began) and the end (what was raised)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    head = limit // 8
    tail = limit - head - len(" … ".encode())
    return data[:head].decode("utf-8", "ignore") + " … " + data[-tail:].decode("utf-8", "ignore")
