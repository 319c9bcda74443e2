"""The documentation site (mkdocs.yml, docs/): its pages, their links, and the page each site
address is built from, so that the alert rules' runbook links can be checked offline."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .tools import ROOT, load_yaml

DOCS = ROOT / "docs"
RUNBOOKS = DOCS / "runbooks"
MKDOCS_YML = ROOT / "mkdocs.yml"
SITE_URL = "https://pgtick.readthedocs.io/en/latest/"
RUNBOOKS_URL = f"{SITE_URL}runbooks/"
# The README is the front page; the site links to its sections (quick start) by this address.
README_URL = "https://github.com/pgtick/pgtick#"

_FENCE = re.compile(r"^ *```.*?^ *```", flags=re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def mkdocs_config() -> dict[str, Any]:
    config: dict[str, Any] = load_yaml(MKDOCS_YML)
    return config


def pages() -> list[Path]:
    """Every Markdown page of the site."""
    return sorted(DOCS.rglob("*.md"))


def runbook_pages() -> list[Path]:
    """One page per alert rule: the runbooks' index is not one."""
    return [page for page in sorted(RUNBOOKS.glob("*.md")) if page.name != "index.md"]


def runbook_page_name(alert: str) -> str:
    """PgtickVacuumBlocked -> vacuum-blocked."""
    words = re.findall(r"[A-Z][a-z0-9]*", alert.removeprefix("Pgtick"))
    return "-".join(word.lower() for word in words)


def page_of_url(url: str) -> Path | None:
    """The page mkdocs builds a site address from (directory URLs: runbooks/x/ comes from
    runbooks/x.md, runbooks/ from runbooks/index.md), or None for an address outside the site
    or not in that form."""
    if not url.startswith(SITE_URL):
        return None
    path = url.removeprefix(SITE_URL)
    if path == "":
        return DOCS / "index.md"
    if not re.fullmatch(r"([a-z0-9-]+/)+", path):
        return None
    directory = DOCS / path / "index.md"
    return directory if directory.exists() else DOCS / f"{path.removesuffix('/')}.md"


def prose(page: Path) -> str:
    """A page's text without its fenced code blocks."""
    return _FENCE.sub("", page.read_text())


def links(page: Path) -> list[str]:
    return _LINK.findall(prose(page))


def headings(page: Path, level: int) -> list[str]:
    return re.findall(rf"^{'#' * level} (.+)$", prose(page), flags=re.MULTILINE)


def nav_pages(nav: list[Any]) -> list[tuple[str | None, str]]:
    """(title, page) for every page of a mkdocs nav, in order; untitled entries give None."""
    out: list[tuple[str | None, str]] = []
    for entry in nav:
        if isinstance(entry, str):
            out.append((None, entry))
            continue
        for title, value in entry.items():
            if isinstance(value, str):
                out.append((title, value))
            else:
                out.extend(nav_pages(value))
    return out
