"""``pgtick``: parse the arguments, run the verb, and map whatever it raised to the documented
exit code (``exits``) with one stderr line; ``--debug`` shows the traceback instead. A reader
that closes the pipe early (``pgtick runs | head -2``) ends the command as it ends Unix tools:
silently, with the status of a SIGPIPE (141).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pgtick.cli import batches
from pgtick.cli.exits import EXIT_FAILURE, EXIT_PIPE, exit_code
from pgtick.cli.parser import build_parser
from pgtick.errors import PgtickError


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        finally:  # --help and usage errors end in SystemExit, with their output buffered
            sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to handle
    except BrokenPipeError:
        # Whatever is still buffered would fail again when the interpreter flushes it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE
    return code


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(batches.shorthand(sys.argv[1:] if argv is None else argv))
    for name, default in (("config", None), ("dsn", None), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except BrokenPipeError:
        raise
    except Exception as exc:
        if args.debug:
            raise
        prefix = "pgtick: " if isinstance(exc, PgtickError) else "pgtick: internal error: "
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"{prefix}{first}", file=sys.stderr)
        return exit_code(exc)
