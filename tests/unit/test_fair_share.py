"""What a worker process claims out of idle (core/worker.py, issue 47): its share of its free
threads, so that a burst is split over the daemon's processes."""

from __future__ import annotations

from pgtick.core.worker import fair_share


def test_one_process_claims_every_free_thread() -> None:
    assert fair_share(8, 1) == 8
    assert fair_share(1, 1) == 1


def test_processes_split_the_free_threads_rounding_up_and_claim_at_least_one() -> None:
    assert fair_share(8, 2) == 4
    assert fair_share(7, 2) == 4
    assert fair_share(8, 3) == 3
    assert fair_share(1, 4) == 1
    assert fair_share(0, 2) == 1  # never asked with none free: the loop waits first
