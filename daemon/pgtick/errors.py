"""The exception tree; the CLI maps it to exit codes in one place (``cli.EXIT_CODES``).

::

    PgtickError
    ├── ConfigError            bad config file, key, value, cron, zone   -> exit 2
    │   ├── ScheduleError      a cron expression or time zone refused    -> exit 2
    │   └── UsageError         a command-line argument or request refused -> exit 2
    ├── MigrationError         a changed migration file, or live daemons -> exit 2
    ├── SchemaOutdatedError    database schema older than this code      -> exit 2
    ├── SchemaNewerError       a newer migration this code cannot run on -> exit 2
    ├── DatabaseError          database unreachable or a query failed    -> exit 3
    ├── NotFoundError          run id, schedule name, ... not found      -> exit 4
    └── JobControl             raised by handlers to steer their run
        ├── Retry              retry after a chosen delay
        └── Fail               give up now: the run goes to ``dead``
"""

from __future__ import annotations

from datetime import timedelta


class PgtickError(Exception):
    """Root of everything pgtick raises on purpose."""


class ConfigError(PgtickError):
    """A config file, key or value is wrong; the message names the key."""


class ScheduleError(ConfigError):
    """A cron expression, time zone or schedule option is refused."""


class UsageError(ConfigError):
    """An operator's argument is wrong (or names a run in the wrong state); the message says
    which and why."""


class MigrationError(PgtickError):
    """A migration cannot be applied: the history in the database does not match the files,
    the role may not migrate, or a migration needs every daemon stopped and some are alive."""


class SchemaOutdatedError(PgtickError):
    """The database schema is older than the code; run ``pgtick migrate``."""


class SchemaNewerError(PgtickError):
    """The database has a migration this code does not know that changed the tables daemons
    of earlier versions read and write; install the pgtick that brought it."""


class DatabaseError(PgtickError):
    """The database could not be reached or a statement failed; ``unreachable``: the former
    (the connection, not the statement: every loop meets it until the database is back)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class NotFoundError(PgtickError):
    """An object named on the command line does not exist."""


class JobControl(PgtickError):
    """Base of the exceptions a handler raises to decide its run's fate."""


class Retry(JobControl):
    """Retry the run after ``after`` seconds (or a ``timedelta``), if attempts remain."""

    def __init__(
        self, after: float | timedelta | None = None, message: str = "retry requested"
    ) -> None:
        super().__init__(message)
        if isinstance(after, timedelta):
            after = after.total_seconds()
        self.after: float | None = None if after is None else float(after)


class Fail(JobControl):
    """Fail the run now and for good: it goes straight to ``dead``."""
