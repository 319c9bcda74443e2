"""The web console: server-rendered pages over ``pgtick.surfaces.operations``, the same facts
as the CLI, with login-guarded actions.

- ``server``: the route table served by waitress, bounded against slow and idle clients;
- ``routes``: the route table, the pages, the login, the actions;
- ``gate``: what every request passes: Host and session checks, the CSP nonce, the bounded
  page read, the refusal of a POST that may not act, who acts;
- ``views``: one function per page, from what ``operations`` returns to a filled template;
- ``fragments``: times, ages and links as the templates show them, ``Page``, the chart's
  geometry, ``render``;
- ``markup``: the Jinja2 environment (autoescaping every template) over ``templates/``, and the
  static files of ``static/``;
- ``attention``: the banner's items, `pgtick status`'s problems read at most once a second;
- ``forms``: the filters, bulk confirmations and job type limits read from a request;
- ``guard``: the session cookie, the CSRF token, the throttle of wrong tokens, the Host and
  origin checks (pure).

Layered in that order (server | routes -> gate -> attention | forms -> views -> fragments ->
markup | guard). waitress and Jinja2 come with the ``console`` extra and are imported only when
the console starts. May import ``pgtick.surfaces.operations``, ``pgtick.surfaces.http``,
``pgtick.storage`` (the store and its records) and ``pgtick.errors``.
"""
