"""Python handlers for the job output tests (named by `handler = "output_jobs:..."`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from pgtick import JobContext

LINES_PER_THREAD = 50
THREADS = 4


def chatty_threads(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Logs from its own thread (ctx.log and the standard library) and from threads it
    starts (through ctx.log: attributable; a bare stdlib logger there is not)."""
    ctx.log.info("handler_started", tag=payload["tag"])
    logging.getLogger("userlib").warning("stdlib from the handler thread %s", payload["tag"])

    def work(i: int) -> None:
        for n in range(LINES_PER_THREAD):
            ctx.log.info("thread_line", tag=payload["tag"], thread=i, n=n)
        logging.getLogger("userlib").warning("stdlib from a started thread")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
