"""output_max_bytes bounds what an attempt's output keeps, whatever its lines' lengths: a line
longer than a tail slot's share (an eighth of the bound) keeps its start, cut to that share
(before, each such line took a slot of its own, whole, and four of them were kept: up to
4 x 8 KiB whatever the bound)."""

from __future__ import annotations

from pgtick.config.schema import MIN_OUTPUT_MAX_BYTES
from pgtick.core.output import Capture, Flusher
from pgtick.storage import db
from pgtick.storage.store import ClaimType, NewRun, RunStore

NOOP = [ClaimType("noop", 60.0, 10)]


def test_stored_output_stays_within_output_max_bytes_with_long_lines(
    store: RunStore, conn: db.Connection
) -> None:
    bound = 4 * MIN_OUTPUT_MAX_BYTES  # "4KiB", a valid output_max_bytes
    run_id = store.enqueue(NewRun("noop"))
    [claimed] = store.claim("w", NOOP, 1)
    capture = Capture(run_id, 1, "noop", claimed.started_at, bound)
    flusher = Flusher(store, "w")
    flusher.add(capture)
    for i in range(20):  # a command printing 20 lines of 3000 bytes, flushed as it goes
        capture.feed("stdout", b"%04d " % i + b"x" * 2995 + b"\n")
        flusher.flush(capture, final=False)
    flusher.finish(capture)
    [(stored,)] = conn.execute(
        "SELECT sum(octet_length(l ->> 2) + 1) FROM output_chunks, jsonb_array_elements(lines) l"
        " WHERE run_id = %s",
        [run_id],
    ).fetchall()
    assert stored <= bound, f"{stored} bytes kept for output_max_bytes = {bound}"
