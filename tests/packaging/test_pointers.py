"""Every pointer a message, a comment or a shipped file gives to a section of the docs
("README: Database roles", "docs/operations: Rolling deploy", 'see "Command handlers under the
unit" in the README') names a file that exists and a heading in it (issue 44, item 6: two
pointed at the README for sections that had moved to docs/operations)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    *sorted((ROOT / "daemon" / "pgtick").rglob("*.py")),
    *sorted((ROOT / "daemon" / "pgtick").rglob("*.sql")),
    *sorted((ROOT / "daemon" / "pgtick").rglob("*.html")),
    *sorted((ROOT / "systemd").iterdir()),
    *sorted((ROOT / "grafana").glob("*.yml")),
    ROOT / "config.example.toml",
]
# "README: Heading", "docs/page.md, Heading", "docs/operations: Heading"
COLON_FORM = re.compile(r"\b(README|docs/[\w/.-]*?\w)(?:\.md)?[:,] ([A-Z][\w' -]*\w)")
# 'see "Heading" in the README' / 'see "Heading" in docs/page.md'
QUOTED_FORM = re.compile(r'"([A-Z][\w\' -]*\w)" in (?:the )?(README|docs/[\w/.-]*?\w)(?:\.md)?\b')


def _page(name: str) -> Path | None:
    if name == "README":
        return ROOT / "README.md"
    for candidate in (ROOT / f"{name}.md", ROOT / name / "index.md", ROOT / name):
        if candidate.is_file():
            return candidate
    return None


def _headings(page: Path) -> list[str]:
    text = page.read_text("utf-8")
    return [
        line.lstrip("#").strip().lower() for line in text.splitlines() if line.startswith("#")
    ] + [m.lower() for m in re.findall(r"^\*\*([^*]+?)\.?\*\*", text, re.MULTILINE)]


def _pointers() -> list[tuple[str, str, str]]:
    found = []
    for source in SOURCES:
        if not source.is_file():
            continue
        text = source.read_text("utf-8", errors="replace")
        where = str(source.relative_to(ROOT))
        found += [(where, page, heading) for page, heading in COLON_FORM.findall(text)]
        found += [(where, page, heading) for heading, page in QUOTED_FORM.findall(text)]
    return found


def test_the_sources_point_at_sections() -> None:
    assert len(_pointers()) >= 5  # the patterns still find what they are for


@pytest.mark.parametrize(("source", "page", "heading"), _pointers())
def test_a_pointer_names_a_page_and_a_heading_in_it(source: str, page: str, heading: str) -> None:
    path = _page(page)
    assert path is not None, f"{source}: {page} does not exist"
    wanted = heading.lower()
    assert any(h == wanted or h.startswith(wanted + " ") for h in _headings(path)), (
        f"{source}: {page} has no section {heading!r}"
    )
