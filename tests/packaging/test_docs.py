"""The documentation site: mkdocs builds it with --strict, every page is in the navigation, the
runbooks answer the same questions in the same order, and links into the README land."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .docsite import (
    DOCS,
    MKDOCS_YML,
    README_URL,
    RUNBOOKS,
    SITE_URL,
    headings,
    links,
    mkdocs_config,
    nav_pages,
    page_of_url,
    pages,
    prose,
    runbook_page_name,
    runbook_pages,
)
from .tools import ROOT, alert_rules, readme_anchors

# What an on-call engineer looks for, in this order, on every runbook page.
RUNBOOK_SECTIONS = ["What it means", "Confirm", "Likely causes", "What to do", "How it resolves"]


def test_mkdocs_config_names_the_site_and_makes_every_doubt_a_warning() -> None:
    config = mkdocs_config()
    assert config["site_name"] == "pgtick"
    assert config["site_url"] == SITE_URL
    assert config["theme"]["name"] == "material"
    # Runbook addresses end in <page>/: the default, directory URLs.
    assert config.get("use_directory_urls", True) is True
    assert config.get("docs_dir", "docs") == "docs"
    assert config["strict"] is True
    assert set(config["validation"].values()) == {"warn"}, config["validation"]


def test_navigation_lists_every_page_once_home_first_then_one_runbook_per_alert() -> None:
    nav = nav_pages(mkdocs_config()["nav"])
    listed = [page for _, page in nav]
    assert len(listed) == len(set(listed)), listed
    assert sorted(listed) == sorted(str(p.relative_to(DOCS)) for p in pages())
    assert nav[0] == ("Home", "index.md")
    runbooks = [(title, page) for title, page in nav if page.startswith("runbooks/")]
    assert runbooks[0] == (None, "runbooks/index.md")
    assert runbooks[1:] == [
        (rule["alert"], f"runbooks/{runbook_page_name(rule['alert'])}.md") for rule in alert_rules()
    ]


def test_no_page_is_a_placeholder() -> None:
    for page in pages():
        text = prose(page)
        assert len(headings(page, 1)) == 1, f"{page.name}: one title"
        assert len(text.split()) >= 100, f"{page.name}: too short to be more than a stub"
        assert not re.search(r"\b(TODO|TBD|FIXME)\b", text), page.name


def test_every_runbook_page_answers_the_on_call_questions_in_order() -> None:
    for page in runbook_pages():
        sections = [h for h in headings(page, 2) if h in RUNBOOK_SECTIONS]
        assert sections == RUNBOOK_SECTIONS, f"{page.name}: {headings(page, 2)}"
        assert "**Severity**:" in prose(page).split("\n## ", 1)[0], page.name


def test_runbooks_index_lists_every_alert_with_its_page_and_severity() -> None:
    rows = re.findall(
        r"^\| \[(Pgtick\w+)\]\(([a-z-]+\.md)\) \| (\w+) \|",
        (RUNBOOKS / "index.md").read_text(),
        flags=re.MULTILINE,
    )
    assert rows == [
        (rule["alert"], f"{runbook_page_name(rule['alert'])}.md", rule["labels"]["severity"])
        for rule in alert_rules()
    ]


def test_every_runbook_states_the_severity_of_its_rule() -> None:
    for rule in alert_rules():
        page = RUNBOOKS / f"{runbook_page_name(rule['alert'])}.md"
        assert f"**Severity**: {rule['labels']['severity']}." in page.read_text(), page.name


def test_links_out_of_the_site_land_on_readme_headings_or_site_pages() -> None:
    """mkdocs --strict checks links between pages; these it cannot: the README's sections and
    the site's own absolute addresses."""
    anchors = readme_anchors()
    for page in pages():
        for url in links(page):
            if url.startswith(README_URL):
                assert url.removeprefix(README_URL) in anchors, (page.name, url)
            elif url.startswith(SITE_URL):
                target = page_of_url(url)
                assert target is not None and target.is_file(), (page.name, url)
            else:
                # Other sites are fine (Keep a Changelog, PostgreSQL's manual); our own
                # repository is linked only at the README's headings, checked above.
                assert "github.com/pgtick/pgtick" not in url, (page.name, url)


@pytest.mark.timeout(60)
def test_mkdocs_builds_the_site_strictly_with_a_page_at_every_runbook_url(
    tmp_path: Path,
) -> None:
    """The whole build (about a second): a warning fails it, and every rule's runbook_url is
    a page of the result."""
    site = tmp_path / "site"
    command = [sys.executable, "-m", "mkdocs", "build", "--strict"]
    proc = subprocess.run(
        [*command, "--config-file", str(MKDOCS_YML), "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    for rule in alert_rules():
        path = rule["annotations"]["runbook_url"].removeprefix(SITE_URL)
        built = site / path / "index.html"
        assert built.is_file(), built
        assert rule["alert"] in built.read_text(), built
