"""`pgtick deploy-files DIR`: write out the files a VM needs (package data in the wheel)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

FILES = ("pgtick.service", "config.example.toml", "dashboard.json", "alerts.yml")


def cmd_deploy_files(args: argparse.Namespace) -> int:
    """Copy the unit, example config, dashboard and alert rules into DIR; no silent overwrite."""
    target = Path(args.dir)
    source = resources.files("pgtick") / "deploy_files"
    existing = [name for name in FILES if (target / name).exists()]
    if existing and not args.force:
        print(f"pgtick: {target / existing[0]} exists; use --force to overwrite", file=sys.stderr)
        return 2
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (target / name).write_bytes((source / name).read_bytes())
        print(target / name)
    return 0
