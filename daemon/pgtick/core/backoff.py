"""Retry delays (exponential, linear or fixed, capped, with jitter): pure functions, so they
are tested exhaustively without a database."""

from __future__ import annotations

import random
from dataclasses import dataclass

BACKOFF_KINDS = ("exponential", "linear", "fixed")
DEFAULT_BACKOFF_BASE_SECONDS = 10.0
DEFAULT_BACKOFF_MAX_SECONDS = 3600.0
DEFAULT_JITTER = 0.2


@dataclass(frozen=True)
class Backoff:
    """How long to wait after failed attempt n (1-based) before the next one."""

    kind: str = "exponential"
    base_seconds: float = DEFAULT_BACKOFF_BASE_SECONDS
    max_seconds: float = DEFAULT_BACKOFF_MAX_SECONDS
    jitter: float = DEFAULT_JITTER

    def __post_init__(self) -> None:
        if self.kind not in BACKOFF_KINDS:
            raise ValueError(f"backoff must be one of {', '.join(BACKOFF_KINDS)}")
        if self.base_seconds < 0 or self.max_seconds < 0 or not 0 <= self.jitter < 1:
            raise ValueError("backoff base/max must be >= 0 and jitter in [0, 1)")

    def base_delay(self, attempt: int) -> float:
        """The delay before jitter: exponential min(max, base * 2**(n-1)), linear, or fixed."""
        if attempt < 1:
            raise ValueError("attempt numbers start at 1")
        if self.kind == "fixed":
            raw = self.base_seconds
        elif self.kind == "linear":
            raw = self.base_seconds * attempt
        else:
            # Cap the exponent: 2**1100 overflows float, and past 2**64 the cap wins anyway.
            raw = self.base_seconds * 2.0 ** min(attempt - 1, 64)
        return min(self.max_seconds, raw)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay with ±jitter applied, never above max_seconds nor below zero."""
        base = self.base_delay(attempt)
        if not self.jitter:
            return base
        factor = 1.0 + self.jitter * (2.0 * (rng or random).random() - 1.0)
        return max(0.0, min(self.max_seconds, base * factor))
