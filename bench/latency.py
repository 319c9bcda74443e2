"""latency: not written yet."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace, admin_dsn: str, tmp: Path, record: common.Record) -> None:
    raise common.BenchError("latency: not written yet")
