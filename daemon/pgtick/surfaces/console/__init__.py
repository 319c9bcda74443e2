"""The web console: server-rendered pages over ``pgtick.surfaces.operations``, the same facts
as the CLI, with token-guarded actions.

- ``routes``: the route table, request parsing, the token and origin checks, the actions;
- ``views``: one function per page, from what ``operations`` returns to a filled template;
- ``fragments``: times, badges, links, forms, the layout and the chart pages are built from;
- ``markup``: the ``string.Template`` engine (every value escaped) and the static files, over
  ``templates/`` and ``static/``.

Layered in that order (routes -> views -> fragments -> markup). May import
``pgtick.surfaces.operations``, ``pgtick.surfaces.http``, ``pgtick.storage`` (the store and its
records) and ``pgtick.errors``.
"""
