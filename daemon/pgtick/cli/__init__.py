"""The ``pgtick`` command line, on top of everything: it may import any layer below it.

- ``main``: parse, run the verb, map the error to its exit code (``exits``) in one place;
- ``parser``: the argparse tree;
- ``setup``, ``runs``, ``schedules``, ``status``: the verbs, grouped by subject; each parses
  its arguments (``args``), asks ``pgtick.surfaces.operations`` (or, for ``run`` and ``demo``,
  the ``Service``) to do the work, and prints the result;
- ``views``: what each verb shows (its JSON documents and tables); ``render``: how it looks
  (tables, JSON, times, durations); ``context``: config, DSN, logging and the store of a command.

No SQL, no pools and no business rules live here (import-linter forbids ``pgtick.core`` and
``storage.db``/``sqlfile``/``migrate``).
"""
