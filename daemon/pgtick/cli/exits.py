"""The documented exit codes and the one mapping from the error tree to them: 0 ok, 1 runtime
failure, 2 usage or config error, 3 database unreachable, 4 not found; 5 from ``status``
when something needs attention; and 141 when the reader of the output closed it early (the
status a Unix tool killed by SIGPIPE leaves).
"""

from __future__ import annotations

from pgtick.errors import (
    ConfigError,
    DatabaseError,
    MigrationError,
    NotFoundError,
    PgtickError,
    SchemaNewerError,
    SchemaOutdatedError,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3
EXIT_NOT_FOUND = 4
EXIT_ATTENTION = 5
EXIT_PIPE = 128 + 13  # SIGPIPE

EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, EXIT_USAGE),
    (MigrationError, EXIT_USAGE),
    (SchemaOutdatedError, EXIT_USAGE),
    (SchemaNewerError, EXIT_USAGE),
    (DatabaseError, EXIT_DATABASE),
    (NotFoundError, EXIT_NOT_FOUND),
    (PgtickError, EXIT_FAILURE),
)


def exit_code(exc: BaseException) -> int:
    """The documented exit code for an error."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILURE
