"""The systemd unit: `systemd-analyze verify` finds nothing to warn about, `systemd-analyze
security` scores it at most 2.0, and it carries the settings the daemon relies on."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pgtick.config import DEFAULT_SHUTDOWN_GRACE_SECONDS

from .docsite import page_of_url
from .tools import SYSTEMD, run, tool

UNIT = SYSTEMD / "pgtick.service"
VENV = "/opt/pgtick/venv"
EXEC_START = f"{VENV}/bin/pgtick run --config /etc/pgtick/config.toml"
MAX_EXPOSURE = 2.0


def directives(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values in order (systemd allows a key several times)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "min" else 1)


def installable_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart's venv moved to a temporary one that exists (verify checks that
    the binary is executable); nothing else changes."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "pgtick").symlink_to(Path(sys.executable).parent / "pgtick")
    text = UNIT.read_text() if text is None else text
    assert text.count(VENV) == 1
    copy = tmp_path / "unit" / UNIT.name
    copy.parent.mkdir()
    copy.write_text(text.replace(VENV, str(tmp_path / "venv")))
    return copy


def test_unit_carries_the_settings_the_daemon_relies_on() -> None:
    unit = directives(UNIT.read_text())
    service = unit["Service"]
    assert service["ExecStart"] == [EXEC_START]
    assert service["Type"] == ["notify"]
    assert service["NotifyAccess"] == ["main"]
    assert service["KillMode"] == ["mixed"]
    assert service["Restart"] == ["on-failure"]
    assert service["RestartPreventExitStatus"] == ["2"]  # config error: a restart cannot help
    assert seconds(service["WatchdogSec"][0]) > 0
    assert seconds(service["TimeoutStopSec"][0]) > DEFAULT_SHUTDOWN_GRACE_SECONDS
    assert service["LoadCredential"] == ["dsn:/etc/pgtick/dsn"]
    assert service["CapabilityBoundingSet"] == [""]
    assert service["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert service["SystemCallFilter"][0] == "@system-service"
    for key in ("StartLimitIntervalSec", "StartLimitBurst"):
        assert key in unit["Unit"] and key not in service, key
    assert unit["Unit"]["After"] == unit["Unit"]["Wants"] == ["network-online.target"]
    for url in unit["Unit"]["Documentation"]:
        page = page_of_url(url)
        assert page is not None and page.is_file(), url


def test_systemd_analyze_verify_reports_nothing(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", "systemd")
    code, out = run(analyze, "verify", str(installable_copy(tmp_path)))
    assert (code, out) == (0, "")


def test_systemd_analyze_verify_does_catch_a_bad_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt directive is reported."""
    analyze = tool("systemd-analyze", "systemd")
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSystm=strict")
    code, out = run(analyze, "verify", str(installable_copy(tmp_path, broken)))
    assert "ProtectSystm" in out, (code, out)


def test_systemd_analyze_security_scores_at_most_two(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", "systemd")
    code, out = run(
        analyze, "security", "--offline=true", "--no-pager", str(installable_copy(tmp_path))
    )
    match = re.search(r"Overall exposure level for pgtick\.service: (\d+\.\d+)", out)
    assert code == 0 and match, out
    assert float(match.group(1)) <= MAX_EXPOSURE, out
