"""Everything that talks to PostgreSQL: connections and pools (``db``), the named queries
(``sqlfile`` and ``sql/queries.sql``), the typed store (``store``) and the migrations
(``migrate`` and ``sql/migrations/``).

The only code that sees psycopg errors; they leave as ``DatabaseError``. May import only
``pgtick.errors``: storage knows nothing of config, scheduling or the daemon's loops.
"""
