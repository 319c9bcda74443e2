"""Progress reports of long operations (issue 18: a long prune shows rows, rate, time left)."""

from __future__ import annotations

import io

from structlog.testing import capture_logs

from pgtick.observability.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reports_rows_rate_and_time_left_once_per_period_then_the_total() -> None:
    clock, screen = Clock(), Terminal()
    progress = Progress("prune succeeded", 10_000, stream=screen, every=1.0, clock=clock)
    with capture_logs() as logs:
        clock.now += 0.5
        progress.advance(1000)  # within the first period: nothing yet
        assert logs == [] and screen.getvalue() == ""
        clock.now += 0.5
        progress.advance(1000)  # 2 000 rows in 1 s: 8 000 left at 2 000/s
        assert screen.getvalue() == (
            "\r\x1b[Kprune succeeded: 2 000 of 10 000 rows (20%), 2 000 rows/s, 4s left"
        )
        clock.now += 4.0
        progress.advance(8000)
        progress.finish()
    assert screen.getvalue().endswith(
        "\r\x1b[Kprune succeeded: 10 000 of 10 000 rows (100%), 2 000 rows/s\n"
    )
    assert [(e["done"], e["total"], e["rate"], e["seconds_left"], e["final"]) for e in logs] == [
        (2000, 10_000, 2000.0, 4.0, False),
        (10_000, 10_000, 2000.0, 0.0, False),  # the last batch, after the period
        (10_000, 10_000, 2000.0, None, True),
    ]
    assert {e["event"] for e in logs} == {"progress"}


def test_long_times_left_read_in_minutes_and_hours() -> None:
    clock = Clock()
    progress = Progress("migrate runs", 10_000_000, clock=clock)
    clock.now += 10
    progress.advance(10_000)
    assert progress.line() == (
        "migrate runs: 10 000 of 10 000 000 rows (0%), 1 000 rows/s, 2h46m left"
    )
    clock.now += 10 * 60  # 610 s for 10 000 + 600 000 rows
    progress.advance(600_000)
    assert progress.line().endswith(", 1 000 rows/s, 2h36m left")
    short = Progress("x", 130, clock=clock)
    clock.now += 1
    short.advance(10)
    assert short.line() == "x: 10 of 130 rows (7%), 10 rows/s, 12s left"
    short.advance(0)
    clock.now += 1  # 10 rows in 2 s: 120 rows left at 5/s
    assert short.line().endswith(", 5 rows/s, 24s left")
    assert Progress("y", 10_000, clock=clock).seconds_left is None  # no rate yet


def test_unknown_total_shows_rows_and_rate_only() -> None:
    clock = Clock()
    progress = Progress("retention dead", None, clock=clock)
    clock.now += 2
    progress.advance(3000)
    assert progress.line() == "retention dead: 3 000 rows, 1 500 rows/s"
    assert progress.seconds_left is None


def test_nothing_on_a_pipe_and_nothing_for_nothing_done() -> None:
    clock, pipe = Clock(), io.StringIO()
    progress = Progress("prune dead", 5, stream=pipe, every=0.0, clock=clock)
    with capture_logs() as logs:
        clock.now += 1
        progress.advance(5)
        progress.finish()
        Progress("prune skipped", 0, stream=pipe, clock=clock).finish()
    assert pipe.getvalue() == ""
    assert [(e["what"], e["final"]) for e in logs] == [("prune dead", False), ("prune dead", True)]
