"""What every verb starts from: the config file, the DSN, quiet logging, and the store of one
command (opened through ``operations``; the CLI builds no pools of its own).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from pgtick import config as config_mod
from pgtick.observability import logs
from pgtick.storage.store import RunStore
from pgtick.surfaces import operations

T = TypeVar("T")


def load(args: argparse.Namespace) -> config_mod.Config:
    return config_mod.load_config(args.config)


def dsn(args: argparse.Namespace, cfg: config_mod.Config) -> str:
    return config_mod.resolve_dsn(cfg.database, args.dsn)


def quiet_logging(args: argparse.Namespace) -> None:
    """Operator commands log only problems, to stderr, readable."""
    logs.configure_logging("console", "debug" if args.debug else "warning", sys.stderr)


def begin(args: argparse.Namespace) -> config_mod.Config:
    """How an operator verb begins: its config (errors first), then quiet logging."""
    cfg = load(args)
    quiet_logging(args)
    return cfg


def store(args: argparse.Namespace, cfg: config_mod.Config) -> AbstractContextManager[RunStore]:
    """The one-connection store of one command, closed however the command ends; its DSN is
    resolved at this call, so after the verb has checked its arguments."""
    return operations.open_store(dsn(args, cfg), cfg.database.schema)


def config_source(cfg: config_mod.Config) -> str:
    """Which config file is in use, or where none was found."""
    if cfg.path is not None:
        return cfg.path
    return (
        f"no config file ({config_mod.DEFAULT_CONFIG_PATH} does not exist; "
        f"--config and ${config_mod.CONFIG_PATH_ENV} not given)"
    )


def call(args: argparse.Namespace, cfg: config_mod.Config, fn: Callable[[RunStore], T]) -> T:
    """``fn`` on the store of this command (``store``): what a verb of one call does."""
    with store(args, cfg) as opened:
        return fn(opened)
