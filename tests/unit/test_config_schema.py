"""The config schema table (pgtick.config.schema.KEYS) against the dataclasses it describes:
the same keys, the same defaults, and every default accepted by its own checker, so a reference
generated from the table says what the daemon does."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pgtick.config import (
    KEYS,
    Config,
    JobTypeConfig,
    Key,
    ScheduleConfig,
    format_duration,
)
from pgtick.config.schema import DURATION, DURATION_OR_ZERO, JOB_TYPE_TABLE, SCHEDULE_TABLE

# Fields filled from elsewhere than a key of their table.
NOT_KEYS = {"name", "path", "job_types", "schedules"}


def defaults_of(table: str) -> Any:
    """The dataclass instance that an empty table means."""
    if table == JOB_TYPE_TABLE:
        return JobTypeConfig(name="t")
    if table == SCHEDULE_TABLE:
        return ScheduleConfig(name="s", job_type="t", cron="* * * * *")
    return getattr(Config(), table)


def test_every_field_has_one_key_and_every_key_a_field() -> None:
    tables = dict.fromkeys(k.table for k in KEYS)
    for table in tables:
        fields = {f.name for f in dataclasses.fields(defaults_of(table))} - NOT_KEYS
        keyed = [k.field for k in KEYS if k.table == table]
        assert sorted(keyed) == sorted(fields), table
    assert len({(k.table, k.name) for k in KEYS}) == len(KEYS)


@pytest.mark.parametrize("key", [k for k in KEYS if not k.required], ids=lambda k: k.name)
def test_the_table_default_is_the_dataclass_default(key: Key) -> None:
    assert getattr(defaults_of(key.table), key.field) == key.default


def toml_spelling(key: Key) -> Any:
    if key.kind in (DURATION, DURATION_OR_ZERO):
        return format_duration(float(key.default))  # type: ignore[arg-type]
    return list(key.default) if isinstance(key.default, tuple) else key.default


@pytest.mark.parametrize("key", [k for k in KEYS if k.default is not None], ids=lambda k: k.name)
def test_every_default_passes_its_own_check(key: Key) -> None:
    assert key.check(f"{key.table}.{key.name}", toml_spelling(key)) == key.default


def test_every_key_is_documented() -> None:
    for key in KEYS:
        assert key.doc and "\n" not in key.doc and key.kind, key
