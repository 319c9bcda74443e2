"""Schedules created at runtime (``pgtick schedules add|edit|remove``, the console, the SQL
functions create_schedule/update_schedule/remove_schedule): owned by the database, never
touched by any daemon's config sync (migration 0022; docs/scheduling.md, "Who owns a
schedule"). A definition is checked by the config's own code, as if it were a
``[schedules.NAME]`` table, before it is stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pgtick.config import config_from_mapping
from pgtick.core.ticker import schedule_def
from pgtick.errors import NotFoundError, UsageError
from pgtick.storage.store import RunStore
from pgtick.surfaces.operations.audit import Actor

# The [schedules.NAME] keys a runtime schedule takes, and the column each is stored in.
KEY_COLUMNS = {
    "job_type": "job_type",
    "cron": "cron",
    "timezone": "timezone",
    "payload": "payload",
    "catchup": "catchup",
    "catchup_limit": "catchup_limit",
    "overlap": "overlap",
    "on_pause": "on_pause",
    "jitter": "jitter_seconds",
    "max_attempts": "max_attempts",
    "priority": "priority",
    # chains and `after` (migration 0028), stored as the config's are
    "on_success": "follow",
    "on_dead": "follow",
    "after": "after_on",
    "after_deadline": "after_on",
    "after_missed": "after_on",
}
# The settings an edit removes when given as '' (the config file has no value for "none").
CLEARABLE = ("on_success", "on_dead", "after")


def _checked(name: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The definition as the store takes it (``ScheduleDef``'s fields), checked as the config
    file's (a ConfigError names the key: ``schedules.NAME.cron: ...``)."""
    cfg = config_from_mapping({"schedules": {name: dict(table)}})
    return dataclasses.asdict(schedule_def(cfg.schedules[name]))


def add_schedule(store: RunStore, name: str, table: Mapping[str, Any], actor: Actor) -> int:
    """Create a database-owned schedule from a ``[schedules.NAME]``-like table; its id. Its
    runs start from its next occurrence."""
    definition = schedule_def(
        config_from_mapping({"schedules": {name: dict(table)}}).schedules[name]
    )
    existing = store.get_schedule(name)
    if existing is not None and not (
        existing["service"] is None and existing["paused_reason"] == "removed"
    ):
        owner = existing["service"]
        by = "the database (pgtick schedules edit)" if owner is None else f"service {owner!r}"
        raise UsageError(f"schedule {name!r} exists, owned by {by}")
    return store.create_schedule(definition, actor.name, actor.via)


def edit_schedule(store: RunStore, name: str, table: Mapping[str, Any], actor: Actor) -> None:
    """Change the settings ``table`` names of a database-owned schedule; the rest stay."""
    if not table:
        raise UsageError("schedules edit: give at least one setting to change")
    row = store.get_schedule(name)
    if row is None or (row["paused_reason"] == "removed" and row["service"] is None):
        raise NotFoundError(f"schedule {name!r} not found")
    if row["service"] is not None:
        raise UsageError(
            f"schedule {name!r} belongs to service {row['service']!r}: change it in that "
            "service's config (its sync would undo an edit here)"
        )
    current = {
        "job_type": row["job_type"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "payload": row["payload"],
        "catchup": row["catchup"],
        "catchup_limit": row["catchup_limit"],
        "overlap": row["overlap"],
        "on_pause": row["on_pause"],
        "jitter": row["jitter_seconds"],
        "priority": row["priority"],
    }
    if row["max_attempts"] is not None:
        current["max_attempts"] = row["max_attempts"]
    current |= {k: v for k, v in (row["follow"] or {}).items() if k in ("on_success", "on_dead")}
    after = row["after_on"]
    if after:
        current |= {
            "after": after["schedule"],
            "after_deadline": f"{after['deadline_seconds']}s",
            "after_missed": after["missed"],
        }
    merged = current | dict(table)
    for key in CLEARABLE:
        if merged.get(key) == "":  # '' removes a chain or an after (with its settings)
            merged.pop(key)
            if key == "after":
                merged.pop("after_deadline", None)
                merged.pop("after_missed", None)
    checked = _checked(name, merged)
    changes = {KEY_COLUMNS[key]: checked[KEY_COLUMNS[key]] for key in table}
    if not store.update_schedule(name, changes, actor.name, actor.via):
        raise NotFoundError(f"schedule {name!r} not found")


def remove_schedule(store: RunStore, name: str, actor: Actor) -> None:
    """Remove a database-owned schedule: paused as removed, its runs' history kept."""
    row = store.get_schedule(name)
    if row is not None and row["service"] is not None:
        raise UsageError(
            f"schedule {name!r} belongs to service {row['service']!r}: remove it from that "
            "service's config"
        )
    if not store.remove_schedule(name, actor.name, actor.via):
        raise NotFoundError(f"schedule {name!r} not found")
