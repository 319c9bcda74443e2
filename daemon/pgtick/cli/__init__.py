"""The ``pgtick`` command line, on top of everything: it may import any layer below it.

Each verb parses its arguments, asks ``pgtick.surfaces.operations`` (or, for ``run`` and
``demo``, the ``Service``) to do the work, and prints the result; ``main`` maps the error tree
to the documented exit codes in one place. No SQL and no business rules live here.
"""
