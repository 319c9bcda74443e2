"""A pool whose every connection a server restart broke serves a working one at once: the
check that finds one broken has every idle one checked (storage/db.py). psycopg_pool alone
hands the broken ones out one at a time, sleeping 1, 2, 4, 8 s between them, so a checkout
waited up to its whole timeout with the server back (a drain gave up on results)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pgtick.embedded import EmbeddedPostgres
from pgtick.storage import db

CONNECTIONS = 8
SERVED_WITHIN_SECONDS = 1.0  # psycopg_pool alone: 0 + 1 + 2 + 4 s for the fifth one


def test_a_pool_broken_by_a_restart_serves_a_new_connection_at_once() -> None:
    data = Path(tempfile.mkdtemp(prefix="pgtick-pool-restart-"))
    server = EmbeddedPostgres(data, throwaway=True)
    try:
        pool = db.make_pool(server.dsn, "public", size=CONNECTIONS, name="restart")
        try:
            with pool.connection() as conn:
                conn.execute("SELECT 1")
            server.stop("fast")  # every pooled connection is now broken
            server.start()
            started = time.monotonic()
            with pool.connection(timeout=30) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            took = time.monotonic() - started
            assert took < SERVED_WITHIN_SECONDS, f"a working connection after {took:.1f}s"
            # And the others were replaced too: as many checkouts at once as the pool holds.
            conns = [pool.getconn(timeout=10) for _ in range(CONNECTIONS)]
            for conn in conns:
                assert conn.execute("SELECT 1").fetchone() == (1,)
                pool.putconn(conn)
        finally:
            pool.close()
    finally:
        server.close()
        shutil.rmtree(data, ignore_errors=True)
