"""Tiny real handlers for ``config.example.toml`` and ``pgtick demo``: something to watch run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgtick.errors import Retry

DEFAULT_SLEEP_SECONDS = 1.0


def hello(ctx: Any, payload: Mapping[str, Any]) -> None:
    """Log a greeting carrying the payload's fields: the smallest visible proof a run happened."""
    ctx.log.info("hello", **payload)


def sleep(ctx: Any, payload: Mapping[str, Any]) -> None:
    """Wait ``payload["seconds"]`` but stop as soon as cancelled, as every long handler should.

    Raising ``Retry`` when cancelled (shutdown, timeout, lost lease) hands the run back instead
    of reporting a success that did not happen.
    """
    seconds = float(payload.get("seconds", DEFAULT_SLEEP_SECONDS))
    if ctx.cancelled.wait(seconds):
        raise Retry(message="cancelled while sleeping")
