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
from collections.abc import Iterator
from typing import Any

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

    def _parse(self, key: str) -> _Parsed:
        parsed = self._keys.get(key)
        if parsed is None:
            metric_name, name, labels, help_text = json.loads(key)
            parsed = (metric_name, name, tuple(sorted(labels.items())), help_text)
            self._keys[key] = parsed
        return parsed

    def collect(self) -> Iterator[Metric]:
        # metric name -> [type, help, {(sample name, labels): value}, {labels: {le: value}}]
        families: dict[str, list[Any]] = {}
        for entry in os.scandir(self._path):
            if not entry.name.endswith(".db"):
                continue
            parts = entry.name[:-3].split("_")
            typ = parts[0]
            mode = parts[1] if typ == "gauge" else ""
            pid = parts[-1]
            try:
                values = MmapedDict.read_all_values_from_file(entry.path)
            except FileNotFoundError:
                continue  # a live gauge's file, removed since the scan
            for key, value, _timestamp, _ in values:
                metric_name, name, labels, help_text = self._parse(key)
                family = families.get(metric_name)
                if family is None:
                    family = families[metric_name] = [typ, help_text, {}, {}]
                samples: dict[tuple[str, Labels], float] = family[2]
                if typ == "histogram" and labels and name.endswith("_bucket"):
                    le = dict(labels).get("le")
                    if le is not None:
                        rest = tuple(kv for kv in labels if kv[0] != "le")
                        buckets = family[3].setdefault(rest, {})
                        bound = float(le)
                        buckets[bound] = buckets.get(bound, 0.0) + value
                        continue
                if typ != "gauge" or mode in ("sum", "livesum"):
                    k = (name, labels)
                    samples[k] = samples.get(k, 0.0) + value
                elif mode in ("all", "liveall"):
                    samples[(name, (*labels, ("pid", pid)))] = value
                elif mode in ("min", "livemin"):
                    k = (name, labels)
                    samples[k] = min(samples.get(k, value), value)
                else:  # max, livemax (and the most recent, which the daemon does not use)
                    k = (name, labels)
                    samples[k] = max(samples.get(k, value), value)
        for metric_name, (typ, help_text, samples, buckets) in families.items():
            metric = Metric(metric_name, help_text, typ)
            for rest, by_bound in buckets.items():
                total = 0.0
                for bound, value in sorted(by_bound.items()):
                    total += value
                    le = (*rest, ("le", floatToGoString(bound)))
                    samples[(metric_name + "_bucket", le)] = total
                samples[(metric_name + "_count", rest)] = total
            for (name, labels), value in samples.items():
                metric.add_sample(name, dict(labels), value)
            yield metric
