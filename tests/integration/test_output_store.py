"""output_chunks on a real PostgreSQL, without a daemon: writes guarded by the claim (a stale
holder cannot write into a later attempt), tail slots upserted and read back in order, the
reader's marker, and the output pruned with its run."""

from __future__ import annotations

import threading

from pgtick.core.output import Capture, Flusher, Line
from pgtick.storage import db
from pgtick.storage.store import Chunk, ClaimType, NewRun, RunStore
from pgtick.surfaces import operations
from tests.integration.leases import expire

NOOP = [ClaimType("noop", 60.0, 10)]


def test_a_stale_holder_cannot_write_into_a_later_attempt(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("noop"))
    [first] = store.claim("w", NOOP, 1)
    assert store.write_output("w", run_id, 1, first.started_at, [Chunk(0, [(5, "stdout", "a")], 0)])
    assert (
        store.write_output(
            "other", run_id, 1, first.started_at, [Chunk(1, [(6, "stdout", "x")], 0)]
        )
        == 0
    )
    expire(conn, [run_id])
    store.reap(lambda job_type, attempt: 0.0)
    [second] = store.claim("w", NOOP, 1)
    assert second.attempt == 2
    late = Chunk(1, [(7, "stdout", "late line of attempt 1")], 0)
    assert store.write_output("w", run_id, 1, first.started_at, [late]) == 0
    assert store.write_output(
        "w", run_id, 2, second.started_at, [Chunk(0, [(1, "stderr", "b")], 0)]
    )
    lines = operations.run_output(store, run_id)
    assert [(x.attempt, x.stream, x.text) for x in lines] == [
        (1, "stdout", "a"),
        (2, "stderr", "b"),
    ]
    assert [x.text for x in operations.run_output(store, run_id, 2)] == ["b"]


def test_flushed_capture_reads_back_head_marker_tail_and_prunes_with_the_run(
    store: RunStore, conn: db.Connection
) -> None:
    run_id = store.enqueue(NewRun("noop"))
    [claimed] = store.claim("w", NOOP, 1)
    capture = Capture(run_id, 1, "noop", claimed.started_at, 4096)
    flusher = Flusher(store, "w")
    flusher.add(capture)
    capture.feed("stdout", b"first\n")
    for i in range(3000):
        capture.feed("stdout", b"line %d\n" % i)
        if i % 500 == 0:
            flusher.flush(capture, final=False)
    capture.feed("stderr", b"last words")
    flusher.finish(capture)
    lines = operations.run_output(store, run_id)
    assert lines[0].text == "first"
    markers = [x for x in lines if x.is_marker]
    assert len(markers) == 1 and markers[0].omitted_bytes == capture.omitted_bytes > 0
    assert lines[-1].text == "last words" and lines[-1].stream == "stderr"
    assert lines[-2].text == "line 2999"
    tail = [x.text for x in lines[lines.index(markers[0]) + 1 :]]
    assert tail == [f"line {i}" for i in range(3000 - len(tail) + 1, 3000)] + ["last words"]
    stored = conn.execute(
        "SELECT sum(octet_length(l ->> 2) + 1) FROM output_chunks, jsonb_array_elements(lines) l"
    ).fetchone()
    assert stored is not None and stored[0] <= 4096
    assert [x.text for x in operations.output_tail(store, run_id, 2)] == ["line 2999", "last words"]

    store.succeed("w", [(run_id, 1)])
    conn.execute("UPDATE runs SET finished_at = now() - interval '8 days' WHERE id = %s", [run_id])
    assert store.prune("succeeded", 7 * 86400) == 1
    assert conn.execute("SELECT count(*) FROM output_chunks").fetchone() == (0,)


def test_a_periodic_flush_still_writing_when_the_attempt_ends_does_not_undo_the_last_lines(
    store: RunStore,
) -> None:
    """The flusher's thread takes a capture's new lines, then writes them; the attempt ends in
    between and the worker writes the rest (the same tail slot, with the last line). The
    periodic write must not land after the final one with the older copy of that slot."""
    run_id = store.enqueue(NewRun("noop"))
    [claimed] = store.claim("w", NOOP, 1)
    capture = Capture(run_id, 1, "noop", claimed.started_at, 1024)
    for i in range(200):  # past the head: the last lines go into the tail slots
        capture.feed("stdout", b"line %d\n" % i)
    taken = threading.Event()
    go_on = threading.Event()

    def on_lines(_capture: Capture, lines: list[Line]) -> None:
        if not taken.is_set():  # the periodic flush: it has taken, and has not written yet
            taken.set()
            go_on.wait(10)

    flusher = Flusher(store, "w", on_lines)
    periodic = threading.Thread(target=lambda: flusher.flush(capture, final=False))
    periodic.start()
    assert taken.wait(10)
    capture.feed("stdout", b"done\n")  # the command's last line, then it exits
    final = threading.Thread(target=lambda: flusher.finish(capture))
    final.start()
    final.join(0.5)  # the final flush waits for the periodic one (or, unguarded, writes now)
    go_on.set()
    periodic.join(10)
    final.join(10)
    texts = [x.text for x in operations.run_output(store, run_id)]
    assert texts[-1] == "done", texts[-3:]
