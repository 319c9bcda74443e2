"""The job type page's 24-hour and 7-day charts (issue 46) as geometry and markup: bars per
hour with the failures stacked on the successes, the totals, a line at each UTC midnight, and
what the page says when the rollups could not be read or hold nothing yet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pgtick.storage.store import JobTypeStats, RollupBucket
from pgtick.surfaces import operations
from pgtick.surfaces.console import fragments
from pgtick.surfaces.console import views as pages
from pgtick.surfaces.console.fragments import Page

NOW = datetime(2026, 11, 23, 10, 30, tzinfo=UTC)
FIRST = datetime(2026, 11, 22, 11, 0, tzinfo=UTC)  # 24 hours: 11:00 yesterday to 10:00 today


def hours(figures: dict[int, tuple[int, int, int]]) -> list[RollupBucket]:
    """24 hours from FIRST; ``figures`` maps an hour's index to (succeeded, failed, lost)."""
    out = []
    for i in range(24):
        ok, failed, lost = figures.get(i, (0, 0, 0))
        start = FIRST + timedelta(hours=i)
        out.append(RollupBucket(start, ok, failed, lost, failed // 2, 0, 0, 1.5 * ok))
    return out


def test_bars_stack_failures_on_successes_per_hour() -> None:
    chart = fragments.history_chart(
        "24h", "Last 24 hours", "-24 h", hours({0: (8, 2, 0), 23: (4, 0, 2)})
    )
    assert chart.peak == 10
    assert [b.x for b in chart.succeeded] == ["0.0", "690.0"]
    [first, last] = chart.failures
    # the failures sit on top of the successes of their hour
    ok0 = chart.succeeded[0]
    assert float(first.y) + float(first.height) == float(ok0.y)
    assert "2 attempts failed or lost" in first.title and "Sun 22 Nov 11:00 UTC" in first.title
    assert last.x == "690.0"
    # a dashed line where a day starts in UTC: midnight is the 13th hour from 11:00
    assert chart.days == [f"{13 * 30:.1f}"]
    assert chart.totals == fragments.HistoryTotals(12, 2, 2, 1, 0, "1.50s")


def test_the_page_says_when_the_rollups_are_missing_or_empty() -> None:
    stats = JobTypeStats("mail", 0, None, 0, 0, 0, 0, 0)
    status = operations.JobTypeStatus(stats, 1)
    late = operations.JobTypeView(NOW, status, [], [], [], None)
    page = pages.job_type_page(late, Page(False, NOW))
    assert 'id="history-late"' in page and 'id="chart-24h"' not in page
    empty = operations.TypeHistory(
        [RollupBucket(FIRST + timedelta(hours=i), 0, 0, 0, 0, 0, 0, 0.0) for i in range(168)],
        None,
    )
    page = pages.job_type_page(
        operations.JobTypeView(NOW, status, [], [], [], empty), Page(False, NOW)
    )
    assert "nothing rolled up yet" in page
    assert 'id="chart-24h"' in page and 'id="chart-7d"' in page and 'class="failures"' not in page
    assert '<tr data-window="7d"><td>Last 7 days</td><td class="num succeeded">0</td>' in page
