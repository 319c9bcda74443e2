"""``Metrics.warm`` (run as a daemon of several processes reports ready): the first merge of the
processes' metric files parses every key, so it is done before any scrape waits for it. In a
child interpreter: multiprocess mode sets prometheus_client's value class for the whole
process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = """
from pgtick.observability.metrics import Metrics

metrics = Metrics({{}}, "0", 0, multiprocess_dir={directory!r})
keys = metrics._merged._keys
assert keys == {{}}, "nothing parsed before the warm-up"
metrics.warm()
parsed = len(keys)
assert parsed > 10, parsed
metrics.exposition("")
assert len(keys) == parsed, "the scrape after it parsed nothing again"
print(parsed)
"""


def test_warm_parses_every_key_before_a_scrape(tmp_path: Path) -> None:
    script = textwrap.dedent(SCRIPT.format(directory=str(tmp_path)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10
