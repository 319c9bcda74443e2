"""``/metrics`` of a daemon of several processes: every process's series, read from the files
of prometheus_client's multiprocess mode and summed, each series once.

prometheus_client's own ``MultiProcessCollector`` does the same, but parses each value's key
again at every scrape and builds a sample object per value of every process before merging:
with the daemon's pre-initialised histograms (a few thousand values per process) a scrape
took 130-320 ms on the 2-core machine under load. This one keeps the parsed keys from one
scrape to the next and merges into plain dictionaries, then builds each merged series once.
The rules are prometheus_client's: counters and histograms summed over every file (a process
that ended keeps counting), gauges by their ``multiprocess_mode`` (``livesum`` summed,
``max``/``livemax`` the largest, ``liveall`` one series per pid); a ``live*`` gauge's file
is removed when its process ends (``Metrics.process_gone``).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Labels = tuple[tuple[str, str], ...]
_Parsed = tuple[str, str, Labels, str]  # metric name, sample name, labels, help


class MergedFiles(Collector):
    """Collects the merged series of every ``*.db`` file under ``path``."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._keys: dict[str, _Parsed] = {}

    def describe(self) -> list[Metric]:
        """Nothing up front: registering would otherwise read every file, in every process,
        while its siblings are creating theirs."""
        return []

    def _parse(self, key: str) -> _Parsed:
        parsed = self._keys.get(key)
        if parsed is None:
            metric_name, name, labels, help_text = json.loads(key)
            parsed = (metric_name, name, tuple(sorted(labels.items())), help_text)
            self._keys[key] = parsed
        return parsed

    def collect(self) -> Iterator[Metric]:
        families: dict[str, _Family] = {}
        for entry in os.scandir(self._path):
            if not entry.name.endswith(".db"):
                continue
            parts = entry.name[:-3].split("_")
            typ, pid = parts[0], parts[-1]
            mode = parts[1] if typ == "gauge" else ""
            try:
                values = MmapedDict.read_all_values_from_file(entry.path)  # type: ignore[no-untyped-call]
            except FileNotFoundError:
                continue  # a live gauge's file, removed since the scan
            except struct.error:
                # A file a starting process has just created and not yet sized (its first
                # 4 bytes, the length used, missing): it holds no value yet.
                continue
            for key, value, _timestamp, _ in values:
                metric_name, name, labels, help_text = self._parse(key)
                family = families.get(metric_name)
                if family is None:
                    family = families[metric_name] = _Family(typ, help_text)
                family.add(mode, pid, name, labels, value)
        for metric_name, family in families.items():
            yield family.metric(metric_name)


class _Family:
    """One metric's values merged over every file."""

    def __init__(self, typ: str, help_text: str) -> None:
        self.typ = typ
        self.help_text = help_text
        self.samples: dict[tuple[str, Labels], float] = {}
        self.buckets: dict[Labels, dict[float, float]] = {}  # histograms: labels -> le -> n

    def add(self, mode: str, pid: str, name: str, labels: Labels, value: float) -> None:
        samples = self.samples
        if self.typ == "histogram" and name.endswith("_bucket"):
            bound = next((float(v) for k, v in labels if k == "le"), None)
            if bound is not None:
                rest = tuple(kv for kv in labels if kv[0] != "le")
                buckets = self.buckets.setdefault(rest, {})
                buckets[bound] = buckets.get(bound, 0.0) + value
                return
        key = (name, labels)
        if self.typ != "gauge" or mode in ("sum", "livesum"):
            samples[key] = samples.get(key, 0.0) + value
        elif mode in ("all", "liveall"):
            samples[(name, (*labels, ("pid", pid)))] = value
        elif mode in ("min", "livemin"):
            samples[key] = min(samples.get(key, value), value)
        else:  # max, livemax (and the most recent, which the daemon does not use)
            samples[key] = max(samples.get(key, value), value)

    def metric(self, metric_name: str) -> Metric:
        """The merged series; a histogram's buckets made cumulative, and its count."""
        samples = self.samples
        for rest, by_bound in self.buckets.items():
            total = 0.0
            for bound, value in sorted(by_bound.items()):
                total += value
                le: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
                samples[(metric_name + "_bucket", (*rest, ("le", le)))] = total
            samples[(metric_name + "_count", rest)] = total
        metric = Metric(metric_name, self.help_text, self.typ)
        for (name, labels), value in samples.items():
            metric.add_sample(name, dict(labels), value)
        return metric
