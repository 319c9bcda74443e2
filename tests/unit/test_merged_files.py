"""The merge of the worker processes' metric files (``MergedFiles``) against real files of
prometheus_client's multiprocess format, including one a starting process has only created."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.registry import CollectorRegistry

from pgtick.observability.multiproc import MergedFiles


def write_counter(path: Path, value: float) -> None:
    counter = MmapedDict(str(path))
    key = mmap_key("pgtick_x", "pgtick_x_total", ["job_type"], ["a"], "X")
    counter.write_value(key, value, 0.0)
    counter.close()


def merged(directory: Path) -> dict[str, float]:
    return {
        sample.name: sample.value
        for family in MergedFiles(str(directory)).collect()
        for sample in family.samples
    }


def test_counters_of_every_process_are_summed(tmp_path: Path) -> None:
    write_counter(tmp_path / "counter_101.db", 2.0)
    write_counter(tmp_path / "counter_102.db", 3.0)
    assert merged(tmp_path) == {"pgtick_x_total": 5.0}


def test_a_file_a_starting_process_has_only_created_is_read_as_empty(tmp_path: Path) -> None:
    """Seen in make test (a supervisor of 2 worker processes): one process read its sibling's
    file between its creation and its sizing (0 bytes), died of ``struct.error`` and the
    daemon exited 1. A scrape while a process restarts meets the same moment."""
    write_counter(tmp_path / "counter_101.db", 2.0)
    (tmp_path / "counter_102.db").touch()
    assert merged(tmp_path) == {"pgtick_x_total": 2.0}


def test_registering_reads_no_file(tmp_path: Path) -> None:
    """Every process registers the merge at start, while its siblings create their files:
    registration must not collect (auto_describe would, without a describe)."""
    (tmp_path / "counter_102.db").write_bytes(b"\xff\xff\xff\x7f")  # used: far past the end
    registry = CollectorRegistry(auto_describe=True)
    registry.register(MergedFiles(str(tmp_path)))
