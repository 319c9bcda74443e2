"""The command handler of the ``cmd`` job type: ``python -m tests.torture.cmd``.

It reads its run from pgtick's environment (PGTICK_RUN_ID, PGTICK_ATTEMPT, PGTICK_PAYLOAD),
appends its start, ticks and end to a history file of its own (it may outlive its daemon), and
does what the payload says: ``cmd_ok`` exits 0 after its seconds, ``cmd_fail`` exits 1,
``cmd_ignore_term`` ignores SIGTERM (the daemon's kill timeout must end it with SIGKILL).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from tests.torture.history import DAEMON_ENV, FAIL, HISTORY_ENV, INFO, INVOKE, OK, HistoryFile

TICK_SECONDS = 2.0
TERMINATED_EXIT = 143


def main() -> int:
    payload: dict[str, Any] = json.loads(os.environ.get("PGTICK_PAYLOAD") or "{}")
    behaviour = str(payload.get("b", "cmd_ok"))
    seconds = float(payload.get("s", 0.1))
    pid = os.getpid()
    file = HistoryFile(
        Path(os.environ[HISTORY_ENV]) / f"cmd-{pid}.jsonl",
        f"{os.environ.get(DAEMON_ENV, 'daemon')}:cmd:{pid}",
    )
    record = {
        "run": int(os.environ["PGTICK_RUN_ID"]),
        "attempt": int(os.environ["PGTICK_ATTEMPT"]),
        "job_type": "cmd",
        "b": behaviour,
        "n": payload.get("n"),
        "daemon": os.environ.get(DAEMON_ENV),
        "pid": pid,
        "command": True,
    }

    def terminated(signum: int, frame: FrameType | None) -> None:
        file.write(FAIL, "handler", {**record, "error": "SIGTERM"})
        os._exit(TERMINATED_EXIT)

    if behaviour == "cmd_ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, terminated)
    file.write(INVOKE, "handler", record)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(TICK_SECONDS, left))
        if end - time.monotonic() > 0:
            file.write(INFO, "handler", {"run": record["run"], "attempt": record["attempt"]})
    if behaviour == "cmd_fail":
        file.write(FAIL, "handler", {**record, "error": "exit 1"})
        return 1
    file.write(OK, "handler", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
