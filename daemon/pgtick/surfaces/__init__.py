"""The operator's interfaces below the CLI: ``operations`` (the operator's verbs as plain
functions returning dataclasses), the HTTP server (``/metrics``, ``/healthz``, ``/readyz``)
and the web console (``console/``).

May import ``pgtick.core``, ``pgtick.config``, ``pgtick.storage``, ``pgtick.scheduling``,
``pgtick.observability`` and ``pgtick.errors``; never ``pgtick.service`` or ``pgtick.cli``,
which sit above and use it.
"""
