"""``pgtick``: parse the arguments, run the verb, and map whatever it raised to the documented
exit code (``exits``) with one stderr line; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pgtick.cli.exits import EXIT_FAILURE, exit_code
from pgtick.cli.parser import build_parser
from pgtick.errors import PgtickError


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, default in (("config", None), ("dsn", None), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    try:
        code: int = args.func(args)
        return code
    except KeyboardInterrupt:
        return EXIT_FAILURE
    except Exception as exc:
        if args.debug:
            raise
        prefix = "pgtick: " if isinstance(exc, PgtickError) else "pgtick: internal error: "
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"{prefix}{first}", file=sys.stderr)
        return exit_code(exc)
