"""pgtick: scheduled and deferred background jobs out of the PostgreSQL you already have."""

from __future__ import annotations

from pgtick.errors import (
    ConfigError,
    DatabaseError,
    Fail,
    NotFoundError,
    PgtickError,
    Retry,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DatabaseError",
    "Fail",
    "NotFoundError",
    "PgtickError",
    "Retry",
    "__version__",
]
