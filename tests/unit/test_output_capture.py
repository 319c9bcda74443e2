"""Capture: lines per stream with their time, a bounded head and tail ring with the omitted
bytes counted, hostile bytes made storable; no database (the writes are tested in
tests/integration/test_output_store.py and with real daemons in tests/acceptance)."""

from __future__ import annotations

import time

import pytest

from pgtick.config import Config
from pgtick.core import handlers
from pgtick.core.output import MAX_LINE_BYTES, TAIL_SLOTS, Capture
from pgtick.errors import ConfigError
from pgtick.storage.output import Chunk

BOUND = 4096


def _capture(bound: int = BOUND) -> Capture:
    return Capture(1, 1, "t", None, bound)


def _stored(chunks: list[Chunk]) -> dict[int, Chunk]:
    """What the table holds after these writes: head chunks once, tail slots upserted; in the
    order the reader shows them (head by seq, then the slots by when last written)."""
    last = {c.seq: i for i, c in enumerate(chunks)}
    order = sorted(last, key=lambda seq: (seq < 0, seq if seq >= 0 else last[seq]))
    by_seq = {c.seq: c for c in chunks}
    return {seq: by_seq[seq] for seq in order}


def _text_bytes(chunks: dict[int, Chunk]) -> int:
    return sum(len(text.encode()) + 1 for c in chunks.values() for _, _, text in c.lines)


def test_lines_keep_their_stream_order_and_time() -> None:
    c = _capture()
    c.feed("stdout", b"hello\nwor")
    c.feed("stderr", b"oops\r\n")
    time.sleep(0.02)
    c.feed("stdout", b"ld\n")
    chunks, lines = c.take(final=True)
    assert [(s, t) for _, s, t in lines] == [
        ("stdout", "hello"),
        ("stderr", "oops"),
        ("stdout", "world"),
    ]
    assert chunks == [Chunk(0, lines, 0)]
    assert c.take(final=True) == ([], [])  # nothing twice


def test_an_unfinished_line_waits_for_its_end_until_the_last_flush() -> None:
    c = _capture()
    c.feed("stdout", b"no newline yet")
    assert c.take(final=False) == ([], [])
    _, lines = c.take(final=True)
    assert [t for _, _, t in lines] == ["no newline yet"]


def test_invalid_utf8_and_nul_are_replaced_not_fatal() -> None:
    c = _capture()
    c.feed("stdout", b"\xff\xfe bin\x00ary \xe2\x82\n")
    _, lines = c.take(final=True)
    assert lines[0][2] == "\ufffd\ufffd bin\ufffdary \ufffd"


def test_a_flood_keeps_head_tail_and_counts_what_it_dropped() -> None:
    c = _capture()
    c.feed("stdout", b"START\n")
    written: list[Chunk] = []
    for i in range(20_000):
        c.feed("stdout", b"%08d filler filler filler\n" % i)
        if i % 997 == 0:
            written += c.take(final=False)[0]
    c.feed("stdout", b"END\n")
    written += c.take(final=True)[0]
    stored = _stored(written)
    assert _text_bytes(stored) <= BOUND
    head = [t for s in sorted(k for k in stored if k >= 0) for _, _, t in stored[s].lines]
    assert head[0] == "START"
    assert {k for k in stored if k < 0} <= set(range(-TAIL_SLOTS, 0))
    newest = list(stored.values())[-1]
    assert newest.lines[-1][2] == "END"
    kept = _text_bytes(stored)
    assert newest.omitted_bytes == c.total_bytes - kept
    assert c.total_bytes == 6 + 20_000 * 30 + 4


def test_a_huge_line_without_newline_is_cut_and_bounded() -> None:
    c = _capture(64 * 1024)
    written: list[Chunk] = []
    for _ in range(1000):  # 100 MB, one line
        c.feed("stdout", b"a" * 100_000)
    c.feed("stdout", b"\ndone\n")
    written += c.take(final=True)[0]
    stored = _stored(written)
    # Exactly the bound: a piece cut from the line counts a line end, as stored (it was 7
    # bytes over when the piece counted only the bytes it took from the stream).
    assert _text_bytes(stored) <= 64 * 1024
    longest = max(len(t) for ch in stored.values() for _, _, t in ch.lines)
    assert longest <= MAX_LINE_BYTES
    assert any(t == "done" for ch in stored.values() for _, _, t in ch.lines)


def test_invalid_bytes_count_as_stored_so_the_bound_holds() -> None:
    bound = 64 * 1024  # the default: a tail slot (8 KiB) holds whole lines of 999 bytes
    c = _capture(bound)
    written: list[Chunk] = []
    for _ in range(1000):  # each invalid byte is stored as U+FFFD, three bytes
        c.feed("stdout", b"\xff" * 999 + b"\n")
        written += c.take(final=False)[0]
    written += c.take(final=True)[0]
    assert _text_bytes(_stored(written)) <= bound


def test_whole_lines_from_log_records_count_against_the_same_bound() -> None:
    c = _capture()
    for i in range(1000):
        c.line("log", f"info record {i}")
    stored = _stored(c.take(final=True)[0])
    texts = [t for chunk in stored.values() for _, _, t in chunk.lines]
    assert texts[0] == "info record 0" and texts[-1] == "info record 999"
    assert _text_bytes(stored) <= BOUND


def test_a_handler_logging_a_flood_between_flushes_holds_only_a_tail_of_it() -> None:
    c = _capture()
    for i in range(100_000):
        c.line("log", f"record {i}")
    assert len(c._ready) + len(c._ready_tail) < 1000  # not 100 000 lines waiting
    stored = _stored(c.take(final=True)[0])
    texts = [t for chunk in stored.values() for _, _, t in chunk.lines]
    assert texts[0] == "record 0" and texts[-1] == "record 99999"
    assert _text_bytes(stored) <= BOUND
    assert list(stored.values())[-1].omitted_bytes == c.total_bytes - _text_bytes(stored)


def test_output_max_bytes_from_a_decorator_goes_through_the_files_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handlers, "_DECORATED", {})

    @handlers.job("small_output", output_max_bytes="2KiB")
    def small(ctx: handlers.JobContext, payload: object) -> None: ...

    assert handlers.resolve(Config())["small_output"].config.output_max_bytes == 2048

    @handlers.job("bad_output", output_max_bytes="2 lightyears")
    def bad(ctx: handlers.JobContext, payload: object) -> None: ...

    with pytest.raises(ConfigError, match=r"bad_output.*output_max_bytes: expected a size"):
        handlers.resolve(Config())
