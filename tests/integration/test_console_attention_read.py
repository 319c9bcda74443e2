"""The banner's read: the first one is waited for, a stale one runs beside the page that found
it stale, so no page waits for `status` (60-90 ms at 1 M runs)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pgtick.storage import db
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations
from pgtick.surfaces.console.attention import ATTENTION_SECONDS, Attention


def test_a_stale_read_runs_beside_the_page(
    store: RunStore, conn: db.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    banner = Attention(
        store,
        heartbeat_seconds=2,
        tick_interval_seconds=60,
        limits=(),
        timeout_seconds=5,
        pool_timeout_seconds=5,
    )
    banner.refresh()  # the first read is waited for
    assert banner.items == ()

    real_status = operations.status
    slow = threading.Event()

    def slow_status(*args: Any, **kwargs: Any) -> Any:
        slow.wait(10)
        return real_status(*args, **kwargs)

    monkeypatch.setattr(operations, "status", slow_status)
    conn.execute(
        "INSERT INTO runs (job_type, status, attempts, locked_by, locked_until, started_at)"
        " VALUES ('record', 'running', 1, 'gone:1:aa', now() - interval '1 hour', now())"
    )
    time.sleep(ATTENTION_SECONDS)
    started = time.monotonic()
    banner.refresh()  # stale: the read starts on its own thread, the page goes on
    assert time.monotonic() - started < 0.5
    assert banner.items == ()
    banner.refresh()  # one read at a time: this one neither waits nor starts another
    slow.set()
    deadline = time.monotonic() + 10
    while not banner.items and time.monotonic() < deadline:
        time.sleep(0.05)
    items: tuple[str, ...] | None = banner.items
    assert items == ("1 stuck run(s) of record (running with an expired lease)",)
