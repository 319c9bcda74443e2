"""A claiming process for the claim-race test: N threads claim until nothing is left.

Usage: python claimer.py DSN THREADS GO_FILE OUT_FILE. Connections run with a 5 s
statement_timeout: the test holds row locks on some runs for longer than that, so a claimer
that waited on another's lock instead of skipping it would fail loudly.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from psycopg.conninfo import make_conninfo

from pgtick.storage import db
from pgtick.storage.store import ClaimType, RunStore

CLAIM_BATCH = 10


def main() -> None:
    dsn, threads, go_file, out_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    pool = db.make_pool(
        make_conninfo(dsn, options="-c statement_timeout=5000"), "pgtick", size=threads
    )
    store = RunStore(pool)
    claimed: dict[int, list[int]] = {i: [] for i in range(threads)}
    errors: list[str] = []
    types = [ClaimType("noop", 60.0, 10)]
    worker = f"claimer-{os.getpid()}"

    def claim_all(i: int) -> None:
        try:
            while True:
                batch = store.claim(worker, types, CLAIM_BATCH)
                if not batch:
                    return
                claimed[i].extend(run.id for run in batch)
        except Exception as exc:
            errors.append(repr(exc))

    while not os.path.exists(go_file):
        time.sleep(0.005)
    workers = [threading.Thread(target=claim_all, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    pool.close()
    with open(out_file, "w") as f:
        json.dump({"claimed": claimed, "errors": errors}, f)


if __name__ == "__main__":
    main()
