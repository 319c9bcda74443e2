"""Flow control as the operator sees it: a job type's limits in the config's words, and the
limited job types of a config (for ``status``, ``show`` and the console).
"""

from __future__ import annotations

from pgtick.config import Config, Rate
from pgtick.core import handlers
from pgtick.core.worker import claim_type
from pgtick.errors import PgtickError
from pgtick.storage.store import ClaimType


def describe_limits(t: ClaimType) -> str:
    """A job type's flow-control limits in the config's words."""
    parts = [f"max_running {t.max_running}"] if t.max_running is not None else []
    if t.max_running_per_key is not None:
        parts.append(f"{t.max_running_per_key} per key")
    if t.rate is not None:
        parts.append(f"rate {Rate(*t.rate)}")
    if t.rate_per_key is not None:
        parts.append(f"{Rate(*t.rate_per_key)} per key")
    return ", ".join(parts)


def flow_limits(config: Config) -> list[ClaimType]:
    """The job types with limits in ``config`` (its [job_types] and, when its imports load
    here, its @pgtick.job types), as the claim sees them."""
    try:
        types = {name: jt.config for name, jt in handlers.resolve(config).items()}
    except (PgtickError, ImportError):
        types = dict(config.job_types)
    return [t for c in types.values() if (t := claim_type(c, 0.0)).limited]
