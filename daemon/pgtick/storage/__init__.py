"""Everything that talks to PostgreSQL: connections and pools (``db``), the named queries
(``sqlfile`` over ``sql/queries.sql``), the typed store and the migrations (``migrate`` over
``sql/migrations/``).

The store is split by aggregate: ``runs`` (runs, attempts, effects), ``schedules``,
``workers`` and ``maintenance`` (reaping, pruning, the metrics reads), each a query class over
``base.StoreBase``; ``store.RunStore`` combines them and ``store`` is the module the rest of
pgtick imports (the store and the records it returns). ``notify`` is the LISTEN connection.

The only code that sees psycopg errors; they leave as ``DatabaseError``. May import only
``pgtick.errors``: storage knows nothing of config, scheduling or the daemon's loops.
"""
