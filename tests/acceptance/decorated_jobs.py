"""Flow-control options given to ``@pgtick.job`` rather than a ``[job_types.NAME]`` table
(tests/acceptance/test_decorated_limits.py), imported through
``worker.imports = ["decorated_jobs"]``: ``flow_jobs.work`` registered under another name."""

from __future__ import annotations

from flow_jobs import work

from pgtick import job

job("one_at_a_time", max_running=1, priority=3)(work)
