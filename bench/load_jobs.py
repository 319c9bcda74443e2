"""Handlers for the sustained-load parts (queue-health, soak), imported by their daemons through
``worker.imports``. Kept apart from ``bench.jobs`` so those parts can be changed on their own."""

from __future__ import annotations

import os
from typing import Any

from bench.load import LEDGER_ENV
from pgtick import JobContext, job


@job("ledger")
def ledger(ctx: JobContext, payload: Any) -> None:
    """Appends the run id to the ledger file: retention deletes succeeded runs and their
    attempts, so this file is what still shows, at the end, how often each run was executed.

    One ``write`` of a short line on an ``O_APPEND`` descriptor is atomic, so the daemon's
    threads need no lock; nothing is added to the database's write load.
    """
    fd = os.open(os.environ[LEDGER_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.run_id}\n".encode())
    finally:
        os.close(fd)
