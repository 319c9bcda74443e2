"""``python -m pgtick``."""

from __future__ import annotations

from pgtick.cli.main import main

raise SystemExit(main())
