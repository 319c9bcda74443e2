"""The template engine of the console: ``string.Template`` files from ``templates/`` whose every
placeholder is filled through ``esc`` (``html.escape`` with quotes), so a payload or an error
holding markup shows as text; only ``Html`` values, built from escaped parts, go in unescaped.
Also the static files of ``static/``.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Iterable
from importlib import resources
from string import Template


class Html(str):
    """Markup that is already safe: built from templates and escaped values only."""

    __slots__ = ()


def esc(value: object) -> Html:
    """``value`` as HTML text (quotes too, so it is safe in a quoted attribute); ``Html``
    passes through unchanged, None shows as a dash."""
    if isinstance(value, Html):
        return value
    if value is None:
        return Html("-")
    return Html(html.escape(str(value), quote=True))


def join(parts: Iterable[object], sep: str = "\n") -> Html:
    """Escaped parts joined by a separator (a literal, not data)."""
    return Html(sep.join(esc(p) for p in parts))


def tag(template: str, **values: object) -> Html:
    """A small inline template (a literal in this module) with every value escaped."""
    return Html(Template(template).substitute({k: esc(v) for k, v in values.items()}))


@functools.cache
def _template(name: str) -> Template:
    text = resources.files(__package__).joinpath("templates", name).read_text("utf-8")
    return Template(text)


def render(name: str, /, **values: object) -> Html:
    """A template file from ``templates/`` with every value escaped (``Html`` as is)."""
    return Html(_template(name).substitute({k: esc(v) for k, v in values.items()}))


@functools.cache
def static_file(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()
