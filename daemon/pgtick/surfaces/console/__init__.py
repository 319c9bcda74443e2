"""The web console: server-rendered pages over ``pgtick.surfaces.operations``, the same facts
as the CLI, with token-guarded actions.

May import ``pgtick.surfaces.operations``, ``pgtick.surfaces.http``, ``pgtick.storage``
(types only) and ``pgtick.errors``.
"""
