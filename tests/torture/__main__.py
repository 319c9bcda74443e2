"""``python -m tests.torture DIR``: judge again the history a run kept (``--keep DIR``).

Exit 0 when the checker finds no violation, 1 when it does, 2 on a usage error.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.torture import report
from tests.torture.run import judge


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "final.json").exists():
        print("usage: python -m tests.torture DIR  (a history kept by --keep DIR)", file=sys.stderr)
        return 2
    verdict = judge(Path(argv[0]))
    print(report.text(verdict))
    return 1 if verdict.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
