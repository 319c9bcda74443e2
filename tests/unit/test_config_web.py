"""The console's ``[web]`` section: off by default, loopback unless a token file is set, and the
token file read with one-line errors naming ``web.token_file``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pgtick.config import (
    Config,
    WebConfig,
    config_from_mapping,
    is_loopback,
    read_token,
    read_viewer_token,
)
from pgtick.errors import ConfigError


def load_text(text: str) -> Config:
    return config_from_mapping(tomllib.loads(text))


def test_the_console_is_off_by_default() -> None:
    web = Config().web
    assert web == WebConfig(listen="", token_file="")
    assert not web.enabled
    assert read_token(web) is None


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("127.0.0.1:8089", "127.0.0.1", 8089),
        ("127.0.0.2:0", "127.0.0.2", 0),
        ("localhost:8089", "localhost", 8089),
        ("[::1]:8089", "::1", 8089),
    ],
)
def test_loopback_needs_no_token(listen: str, host: str, port: int) -> None:
    web = load_text(f'[web]\nlisten = "{listen}"').web
    assert (web.enabled, web.host, web.port) == (True, host, port)


@pytest.mark.parametrize("listen", ["0.0.0.0:8089", "[::]:8089", "10.1.2.3:80", "console.lan:80"])
def test_non_loopback_without_token_file_names_web_listen(listen: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(f'[web]\nlisten = "{listen}"')
    message = str(info.value)
    assert message.startswith("web.listen: "), message
    assert "web.token_file" in message


def test_non_loopback_with_token_file_is_allowed() -> None:
    web = load_text('[web]\nlisten = "0.0.0.0:8089"\ntoken_file = "/run/token"').web
    assert (web.host, web.port, web.token_file) == ("0.0.0.0", 8089, "/run/token")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[web]\nlisten = 8089", "web.listen: expected"),
        ('[web]\nlisten = "8089"', "web.listen: "),
        ("[web]\ntoken_file = 3", "web.token_file: "),
        ('[web]\ntoken = "x"', "web.token: unknown key"),
    ],
)
def test_bad_web_keys_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_text(text)


def test_is_loopback() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


def test_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  s3cret-token\n")
    assert read_token(WebConfig(listen="", token_file=str(path))) == "s3cret-token"


def test_token_file_missing_or_empty_names_the_key(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=rf"^web.token_file: cannot read {missing}: "):
        read_token(WebConfig(token_file=str(missing)))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=rf"^web.token_file: {empty} is empty$"):
        read_token(WebConfig(token_file=str(empty)))


def test_check_exits_2_naming_web_listen(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[web]\nlisten = "0.0.0.0:8089"\n')
    done = subprocess.run(
        [sys.executable, "-m", "pgtick", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "web.listen: " in lines[0], done.stderr


def test_session_hosts_and_public_reads() -> None:
    web = load_text(
        '[web]\nlisten = "0.0.0.0:8089"\ntoken_file = "/t"\nsession_ttl = "30m"\n'
        'hosts = ["PGTICK.internal", "pgtick.example.com"]\npublic_reads = true\n'
    ).web
    assert web.session_ttl_seconds == 1800
    assert web.hosts == ("pgtick.internal", "pgtick.example.com")
    assert web.public_reads is True
    defaults = Config().web
    assert (defaults.session_ttl_seconds, defaults.hosts, defaults.public_reads) == (
        12 * 3600,
        (),
        False,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('session_ttl = "0s"', "web.session_ttl: must be longer than 0s"),
        ('session_ttl = "60d"', "web.session_ttl: must be at most 30d"),
        ('hosts = "pgtick.internal"', "web.hosts: expected an array of host names"),
        ('hosts = ["pgtick.internal:8089"]', "web.hosts[0]: expected a host name without a port"),
        ("hosts = [1]", "web.hosts[0]: expected a host name without a port"),
        ('public_reads = "yes"', "web.public_reads: expected true or false"),
    ],
)
def test_bad_session_hosts_and_public_reads_name_the_key(line: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_text(f'[web]\nlisten = "127.0.0.1:0"\n{line}\n')
    assert str(refused.value).startswith(message), str(refused.value)


def test_reads_need_a_session_beyond_loopback_unless_public_reads() -> None:
    from typing import cast

    from pgtick.storage.store import RunStore
    from pgtick.surfaces.console.routes import Console

    store = cast(RunStore, None)
    beyond = Console(store, "t", heartbeat_seconds=20, listen_host="0.0.0.0")
    assert beyond.reads_need_login
    assert not Console(store, "t", heartbeat_seconds=20, listen_host="127.0.0.1").reads_need_login
    assert not Console(store, "t", heartbeat_seconds=20, listen_host="::1").reads_need_login
    opted_out = Console(store, "t", heartbeat_seconds=20, listen_host="0.0.0.0", public_reads=True)
    assert not opted_out.reads_need_login


def test_viewer_token_file_is_read_and_must_differ_from_the_operators(tmp_path: Path) -> None:
    operators, viewers = tmp_path / "op", tmp_path / "view"
    operators.write_text("op-token\n")
    viewers.write_text("view-token\n")
    web = WebConfig(token_file=str(operators), viewer_token_file=str(viewers))
    assert read_viewer_token(web) == "view-token"
    assert read_viewer_token(WebConfig(token_file=str(operators))) is None
    viewers.write_text("op-token\n")
    with pytest.raises(ConfigError, match=r"web\.viewer_token_file: holds the same token"):
        read_viewer_token(web)


def test_a_viewer_token_alone_serves_beyond_loopback() -> None:
    cfg = config_from_mapping(
        {"web": {"listen": "0.0.0.0:8089", "viewer_token_file": "/run/x/web-viewer"}}
    )
    assert cfg.web.viewer_token_file == "/run/x/web-viewer" and not cfg.web.token_file
