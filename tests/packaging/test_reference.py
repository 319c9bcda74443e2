"""The references of the docs site are generated from the code (tools/reference.py): the
committed pages are what the code renders now, and they name every key, verb, option and
metric family the program has."""

from __future__ import annotations

import argparse
import re

import pytest
from tools import reference

from pgtick.cli.parser import build_parser
from pgtick.config import schema


@pytest.mark.parametrize("name", sorted(reference.PAGES))
def test_the_committed_reference_page_is_what_the_code_renders(name: str) -> None:
    committed = (reference.REFERENCE / name).read_text()
    assert committed == reference.PAGES[name](), f"docs/reference/{name} is stale: make reference"


def _section(page: str, title: str) -> str:
    start = page.index(f"\n## {title}\n")
    end = page.find("\n## ", start + 1)
    return page[start : None if end < 0 else end]


def test_the_config_reference_lists_every_key_under_its_table() -> None:
    page = (reference.REFERENCE / "config.md").read_text()
    assert len(schema.KEYS) >= 40
    for key in schema.KEYS:
        assert f"| `{key.name}` |" in _section(page, f"`[{key.table}]`"), key


def _walk(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, list[str]]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options = [
                    o
                    for a in sub._actions
                    if not isinstance(a, argparse._HelpAction)
                    for o in a.option_strings
                ]
                found.append((f"{prefix} {name}", options))
                found += _walk(sub, f"{prefix} {name}")
    return found


def test_the_cli_reference_lists_every_verb_with_each_of_its_options() -> None:
    page = (reference.REFERENCE / "cli.md").read_text()
    verbs = _walk(build_parser(), "pgtick")
    assert {"pgtick run", "pgtick migrate", "pgtick schedules backfill"} <= {v for v, _ in verbs}
    for verb, options in verbs:
        section = _section(page, f"`{verb}`")
        for option in options:
            assert re.search(rf"`{re.escape(option)}[ ,`]", section), (verb, option)


def test_the_metrics_reference_lists_every_family_the_collectors_define() -> None:
    page = (reference.REFERENCE / "metrics.md").read_text()
    families = [f for f in reference.metric_families() if f.name.startswith("pgtick_")]
    assert len(families) >= 25
    for family in families:
        suffix = "_total" if family.type == "counter" else ""
        assert f"| `{family.name}{suffix}` | {family.type} |" in page, family.name
