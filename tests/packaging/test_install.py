"""The release artifact as a user gets it: the wheel, installed into a fresh virtualenv in a
temporary directory with no source tree on the path, migrates a real database, runs a daemon
that drains a run, serves the console with its templates and static files, and hands out
deployment files that systemd and promtool accept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgtick

from .tools import ROOT, run, tool

# The extras a VM installs beside the core (none of the test or development ones).
EXTRAS = "[console]"
CONFIG = """
[database]
schema = "pgtick"

[worker]
threads = 2
poll_interval = "250ms"

[metrics]
listen = "127.0.0.1:0"

[web]
listen = "127.0.0.1:0"

[job_types.cleanup]
command = ["/bin/sh", "-c", "cat >/dev/null; echo cleaned"]
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, installed into a new virtualenv; its bin directory."""
    work = tmp_path_factory.mktemp("install")
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
        # Not the caller's PYTHONPATH: a source tree on it (daemon/, with the egg-info the
        # build leaves there) reads to pip as pgtick installed already.
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return venv / "bin"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that could point Python at the source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("PGTICK_CONFIG", None)
    env.pop("PGTICK_DSN", None)
    return {**env, **extra}


def pgtick_cli(
    bin_dir: Path, cwd: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "pgtick"), *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_installed_package_is_not_the_source_tree(installed: Path, tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(installed / "python"), "-c", "import pgtick; print(pgtick.__file__)"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    location = Path(proc.stdout.strip())
    assert "site-packages" in location.parts, location
    assert not location.is_relative_to(ROOT), location


def test_version_and_deployment_files_pass_systemd_and_promtool(
    installed: Path, tmp_path: Path
) -> None:
    version = pgtick_cli(installed, tmp_path, "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"pgtick {pgtick.__version__}")

    files = tmp_path / "files"
    out = pgtick_cli(installed, tmp_path, "deploy-files", str(files))
    assert out.returncode == 0, out.stderr
    names = {p.name for p in files.iterdir()}
    assert names == {"pgtick.service", "config.example.toml", "dashboard.json", "alerts.yml"}
    json.loads((files / "dashboard.json").read_text())

    promtool = tool("promtool", "prometheus")
    code, text = run(promtool, "check", "rules", str(files / "alerts.yml"))
    assert code == 0 and "SUCCESS" in text, text

    # systemd checks that ExecStart's binary exists: point the unit at this install.
    unit = (files / "pgtick.service").read_text()
    assert unit.count("/opt/pgtick/venv") == 1, unit
    verify_dir = tmp_path / "unit"
    verify_dir.mkdir()
    (verify_dir / "pgtick.service").write_text(
        unit.replace("/opt/pgtick/venv", str(installed.parent))
    )
    analyze = tool("systemd-analyze", "systemd")
    code, text = run(analyze, "verify", str(verify_dir / "pgtick.service"))
    assert (code, text) == (0, ""), text


def _listening(log: Path, key: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "http_listening" and event.get("key") == key:
                return int(event["port"])
        time.sleep(0.1)
    raise AssertionError(f"no http_listening for {key}:\n{log.read_text()[-3000:]}")


@pytest.fixture
def daemon(installed: Path, empty_dsn: str, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """`pgtick migrate`, `pgtick check --db`, then `pgtick run` from the install; the console's
    port and the daemon's log."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    migrate = pgtick_cli(
        installed, tmp_path, "migrate", "--config", str(config), PGTICK_DSN=empty_dsn
    )
    assert migrate.returncode == 0, migrate.stderr
    check = pgtick_cli(
        installed, tmp_path, "check", "--db", "--config", str(config), PGTICK_DSN=empty_dsn
    )
    assert check.returncode == 0, check.stdout + check.stderr
    log = tmp_path / "daemon.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [str(installed / "pgtick"), "run", "--config", str(config)],
            cwd=tmp_path,
            env=clean_env(PGTICK_DSN=empty_dsn),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield _listening(log, "web.listen", time.monotonic() + 30), log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_installed_daemon_drains_a_run_and_serves_the_console(
    installed: Path, empty_dsn: str, tmp_path: Path, daemon: tuple[int, Path]
) -> None:
    port, _log = daemon
    enqueue = pgtick_cli(installed, tmp_path, "enqueue", "cleanup", PGTICK_DSN=empty_dsn)
    assert enqueue.returncode == 0, enqueue.stderr
    run_id = int(enqueue.stdout.strip())
    deadline = time.monotonic() + 30
    status = None
    while time.monotonic() < deadline:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT status FROM pgtick.runs WHERE id = %s", (run_id,)).fetchone()
        status = None if row is None else row[0]
        if status == "succeeded":
            break
        time.sleep(0.2)
    assert status == "succeeded"

    base = f"http://127.0.0.1:{port}"
    for path, marker in [
        ("/", "<html"),
        ("/runs", f"/runs/{run_id}"),
        (f"/runs/{run_id}", "cleanup"),
        ("/schedules", "<html"),
        ("/static/console.css", "{"),
        ("/static/favicon.svg", "<svg"),
    ]:
        with urllib.request.urlopen(base + path, timeout=10) as response:
            body = response.read().decode()
            assert response.status == 200, path
        assert marker in body, (path, body[:500])
