"""The template engine of the console: Jinja2 over ``templates/``, autoescaping every template,
so a payload or an error holding markup shows as text and nothing is escaped by hand; a value
goes in unescaped only when the code marks it ``Markup`` (the templates' own macros do). Also the
static files of ``static/``.

Jinja2 comes with the ``console`` extra and is imported only when an environment is built, so
the daemon runs without it when the console is off.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jinja2

TEMPLATES = "templates"


def environment(
    filters: Mapping[str, Callable[..., Any]], names: Mapping[str, Any]
) -> jinja2.Environment:
    """A Jinja2 environment over the package's templates: autoescape on for every template,
    undefined names an error (a typo in a template fails its test, not silently renders
    nothing), ``filters`` and global ``names`` available to every template."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader(__package__ or "pgtick.surfaces.console", TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(filters)
    env.globals.update(names)
    return env


@functools.cache
def static_file(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()
