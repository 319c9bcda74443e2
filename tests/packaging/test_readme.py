"""The README is for the operator who opens it (issue 44, item 8): at most 150 lines, the
two first looks (pip and a checkout), the Debian packages the suite needs; the maintainers'
material lives on the docs site, in its navigation."""

from __future__ import annotations

from .tools import README, ROOT

MAX_LINES = 150


def test_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_readme_starts_from_the_first_looks() -> None:
    text = README.read_text()
    assert "pip install 'pgtick[embedded,console]'" in text and "pgtick demo" in text
    assert "make demo" in text and "make test" in text
    for package in ("postgresql-15", "pgbouncer", "prometheus", "systemd", "chromium"):
        assert f"`{package}`" in text, package
    for heading in ("## When to pick it", "## Install on a VM", "## A first job"):
        assert heading in text, heading


def test_the_moved_material_is_in_the_docs_navigation() -> None:
    listed = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    for page in ("architecture.md", "performance.md", "development.md", "roadmap.md"):
        assert page in listed, page
    assert "## Latest figures" in (ROOT / "docs" / "performance.md").read_text()
    assert "## Where a run's rows go" in (ROOT / "docs" / "architecture.md").read_text()
    first = (ROOT / "docs" / "index.md").read_text()
    assert first.index("pip install 'pgtick[embedded,console]'") < first.index("make demo")
