"""What ``pgtick demo`` adds to a daemon for a first look without a checkout: the example
config shipped in the package when no config file is given, free ports when the usual ones
are taken (another daemon or demo on the machine), and what to try next.
"""

from __future__ import annotations

import dataclasses
import shlex
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

from pgtick import config as config_mod
from pgtick.config.values import split_listen

# The example config in the wheel (`pgtick deploy-files DIR` writes it out to edit).
EXAMPLE_CONFIG = "config.example.toml"
# Job types of the example config that the next steps suggest runs of, when the config has them.
TRY_SLEEP_TYPE = "sleep"
TRY_SLEEP_PAYLOAD = '{"seconds": 30}'


@contextmanager
def example_config() -> Iterator[Path]:
    """The example config shipped in the package, as a file."""
    source = resources.files("pgtick") / "deploy_files" / EXAMPLE_CONFIG
    with resources.as_file(source) as path:
        yield path


def load(config_arg: str | None) -> tuple[config_mod.Config, str]:
    """The demo's config and where it came from: the file given (``--config``,
    ``$PGTICK_CONFIG``, /etc/pgtick/config.toml), else the example in the package."""
    cfg = config_mod.load_config(config_arg)
    if cfg.path is not None:
        return cfg, cfg.path
    with example_config() as path:
        return config_mod.load_config(path), "the example shipped with pgtick"


def _free(listen: str) -> str:
    """``listen`` when its port can be bound now, else (or for port 0) the same host on a port
    the system picks: a demo beside another daemon still starts, and says where it listens."""
    if not listen:
        return listen
    host, port = split_listen(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.bind((host, 0))
        port = sock.getsockname()[1]  # also the one chosen for a port of 0
    return f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"


def with_free_ports(cfg: config_mod.Config, web_listen: str) -> config_mod.Config:
    """The console on ``web_listen`` unless the config sets one, and both servers on ports
    that are free now (``_free``)."""
    listen = cfg.web.listen or web_listen
    return dataclasses.replace(
        cfg,
        web=dataclasses.replace(cfg.web, listen=_free(listen)),
        metrics=dataclasses.replace(cfg.metrics, listen=_free(cfg.metrics.listen)),
    )


def next_steps(cfg: config_mod.Config, dsn: str, source: str) -> list[str]:
    """What the demo prints after its ``PGTICK_DSN=`` line: where to look and what to try."""
    lines = [f"console: http://{cfg.web.listen}/", f"config: {source}"]
    if cfg.metrics.listen:
        lines.append(f"metrics: http://{cfg.metrics.listen}/metrics")
    lines += [
        "",
        "Try, in another shell:",
        f"  export PGTICK_DSN={shlex.quote(dsn)}",
        "  pgtick runs                  # what ran, newest first",
        "  pgtick status                # workers, queues, schedules",
    ]
    if TRY_SLEEP_TYPE in cfg.job_types:
        lines.append(f"  pgtick enqueue {TRY_SLEEP_TYPE} --payload '{TRY_SLEEP_PAYLOAD}'")
        lines.append("  pgtick logs RUN_ID --follow  # RUN_ID: the number enqueue printed")
    elif cfg.job_types:
        lines.append(f"  pgtick enqueue {sorted(cfg.job_types)[0]}")
    lines += [
        "  pgtick deploy-files ./pgtick  # the example config, unit file, dashboard, alerts",
        "Ctrl-C stops the demo; its database stays in the data directory for the next one.",
        "",
    ]
    return lines
