"""`pgtick demo` without a checkout (issue 44, item 4): the example config from the package
when no config file is given, free ports when the usual ones are taken, what to try next."""

from __future__ import annotations

import socket

import pytest

from pgtick.cli import demo


@pytest.fixture(autouse=True)
def no_config_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGTICK_CONFIG", raising=False)


def test_no_config_file_means_the_example_in_the_package() -> None:
    cfg, source = demo.load(None)
    assert source == "the example shipped with pgtick"
    assert {"hello", "sleep", "cleanup"} <= set(cfg.job_types)
    assert {"every_minute", "nightly_cleanup"} <= set(cfg.schedules)


def test_a_taken_port_is_replaced_by_a_free_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg, _ = demo.load(None)
        cfg = demo.with_free_ports(cfg, f"127.0.0.1:{port}")
    host, _, chosen = cfg.web.listen.rpartition(":")
    assert host == "127.0.0.1" and int(chosen) not in (0, port)


def test_the_next_steps_name_the_console_and_commands_to_try() -> None:
    cfg, source = demo.load(None)
    cfg = demo.with_free_ports(cfg, "127.0.0.1:0")
    lines = demo.next_steps(cfg, "postgresql:///x?host=/tmp/a b", source)
    assert lines[0] == f"console: http://{cfg.web.listen}/"
    assert "  export PGTICK_DSN='postgresql:///x?host=/tmp/a b'" in lines
    assert any(line.startswith("  pgtick enqueue sleep") for line in lines)
