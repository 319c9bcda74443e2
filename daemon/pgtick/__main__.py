"""``python -m pgtick``."""

from __future__ import annotations

from pgtick.cli import main

raise SystemExit(main())
