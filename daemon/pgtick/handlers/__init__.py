"""The handler API at the import path the README has always shown handler modules
(``from pgtick.handlers import JobContext, job``), kept so that code written against it keeps
working; ``from pgtick import JobContext, job`` is the same objects. The implementation lives in
``pgtick.core.handlers``. Public API: imports only from ``pgtick.core.handlers``.
"""

from __future__ import annotations

from pgtick.core.handlers import JobContext, job

__all__ = ["JobContext", "job"]
