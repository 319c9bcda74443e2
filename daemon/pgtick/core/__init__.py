"""The daemon's loops and their state: the run lifecycle (the one owner of held runs), the
worker pool, the ticker, the heartbeat, the reaper, the LISTEN loop, database-derived gauges,
handlers (Python and command) and retry backoff.

May import ``pgtick.config``, ``pgtick.storage``, ``pgtick.scheduling``,
``pgtick.observability`` and ``pgtick.errors``; never the operator surfaces, the CLI or the
composition root (``pgtick.service`` wires these parts together).
"""
