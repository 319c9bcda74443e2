"""The command line without a database: parsing of every verb, `schedules next` from the config
file alone, and one-line errors with the documented exit codes."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog

from pgtick.cli import exits, parser, render, runs, schedules, setup
from pgtick.cli import main as cli
from pgtick.core import ticker
from pgtick.errors import (
    ConfigError,
    DatabaseError,
    NotFoundError,
    PgtickError,
    ScheduleError,
    UsageError,
)

# Nothing listens on port 1: a command that tried to connect would fail (after a pool timeout)
# with exit 3 instead of printing.
UNREACHABLE_DSN = "postgresql://nobody@127.0.0.1:1/none"

CONFIG = """
[job_types.noop]
command = ["/bin/true"]

[schedules.nightly]
job_type = "noop"
cron = "30 2 * * *"
timezone = "Europe/Amsterdam"

[schedules.hourly]
job_type = "noop"
cron = "0 * * * *"
timezone = "Europe/Amsterdam"

[schedules.spread]
job_type = "noop"
cron = "0 * * * *"
timezone = "Asia/Kathmandu"
jitter = "30s"
"""


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """cli.main configures logging onto capsys's stream; later tests must not write to it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    structlog_config = structlog.get_config()
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)
    structlog.configure(**structlog_config)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture
def no_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTICK_DSN", UNREACHABLE_DSN)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    """Exit code, stdout lines and stderr lines of one in-process ``pgtick`` call."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def error_line(err: list[str]) -> str:
    """The one stderr line an error must produce."""
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


# --- parsing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "func", "expected"),
    [
        (["run"], setup.cmd_run, {"migrate": False}),
        (["run", "--migrate"], setup.cmd_run, {"migrate": True}),
        (["migrate"], setup.cmd_migrate, {"force": False}),
        (["migrate", "--force"], setup.cmd_migrate, {"force": True}),
        (["check"], setup.cmd_check, {"db": False}),
        (["check", "--db"], setup.cmd_check, {"db": True}),
        (
            ["enqueue", "t", "--payload", "{}", "--in", "5m", "--key", "k", "--max-attempts", "3"],
            runs.cmd_enqueue,
            {"job_type": "t", "payload": "{}", "in_": "5m", "key": "k", "max_attempts": 3},
        ),
        (
            ["enqueue", "t", "--run-at", "2026-11-22T09:00:00Z"],
            runs.cmd_enqueue,
            {"run_at": "2026-11-22T09:00:00Z"},
        ),
        (["demo", "--data-dir", "/tmp/x"], setup.cmd_demo, {"data_dir": "/tmp/x"}),
        (["schedules"], schedules.cmd_schedules, {"json": False, "action": None}),
        (["schedules", "--json"], schedules.cmd_schedules, {"json": True}),
        (["schedules", "pause", "a"], schedules.cmd_schedules_pause, {"name": "a"}),
        (["schedules", "resume", "a"], schedules.cmd_schedules_resume, {"name": "a"}),
        (["schedules", "trigger", "a"], schedules.cmd_schedules_trigger, {"name": "a"}),
        (
            ["schedules", "next", "a"],
            schedules.cmd_schedules_next,
            {"name": "a", "count": 5, "from_": None},
        ),
        (
            ["schedules", "next", "a", "--count", "12", "--from", "2026-10-24"],
            schedules.cmd_schedules_next,
            {"count": 12, "from_": "2026-10-24"},
        ),
        (
            ["schedules", "backfill", "a", "--from", "2026-10-01", "--to", "2026-10-02"],
            schedules.cmd_schedules_backfill,
            {"name": "a", "from_": "2026-10-01", "to": "2026-10-02"},
        ),
        (
            ["schedules", "pause", "a", "--config", "c.toml", "--dsn", "d", "--debug"],
            schedules.cmd_schedules_pause,
            {"config": "c.toml", "dsn": "d", "debug": True},
        ),
        (
            ["--config", "c.toml", "schedules", "--dsn", "d", "next", "a"],
            schedules.cmd_schedules_next,
            {"config": "c.toml", "dsn": "d"},
        ),
    ],
)
def test_every_verb_parses(argv: list[str], func: Any, expected: dict[str, Any]) -> None:
    args = parser.build_parser().parse_args(argv)
    assert args.func is func
    for name, value in expected.items():
        assert getattr(args, name) == value, name


@pytest.mark.parametrize(
    "argv",
    [
        ["schedules", "pause"],
        ["schedules", "next", "a", "--count", "0"],
        ["schedules", "next", "a", "--count", "many"],
        ["schedules", "backfill", "a", "--from", "2026-10-01"],
        ["schedules", "backfill", "a", "--to", "2026-10-01"],
        ["schedules", "frobnicate", "a"],
        ["enqueue", "t", "--run-at", "2026-11-22T09:00:00Z", "--in", "5m"],
    ],
)
def test_argument_mistakes_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == exits.EXIT_USAGE
    line = error_line(capsys.readouterr().err.splitlines())
    assert line.startswith("pgtick")
    assert line.endswith("--help)")


# --- schedules next: the config file is enough ----------------------------------------------------


@pytest.mark.usefixtures("no_database")
def test_next_on_the_fall_back_day_fires_a_fixed_time_once(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "schedules", "next", "nightly", "--config", str(config_file),
        "--from", "2026-10-24T12:00:00Z", "--count", "2",
    )  # fmt: skip
    assert (code, err) == (0, [])
    assert out == [
        "2026-10-25T00:30:00+00:00  2026-10-25 02:30:00 CEST (+02:00)",
        "2026-10-26T01:30:00+00:00  2026-10-26 02:30:00 CET (+01:00)",
    ]


@pytest.mark.usefixtures("no_database")
def test_next_on_the_spring_forward_day_fires_at_the_end_of_the_gap(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "schedules", "next", "nightly", "--config", str(config_file),
        "--from", "2026-03-28T12:00:00", "--count", "2",
    )  # fmt: skip
    assert code == 0
    assert out == [
        "2026-03-29T01:00:00+00:00  2026-03-29 03:00:00 CEST (+02:00)",
        "2026-03-30T00:30:00+00:00  2026-03-30 02:30:00 CEST (+02:00)",
    ]


@pytest.mark.usefixtures("no_database")
def test_next_hourly_keeps_both_passes_of_the_repeated_hour_apart_by_offset(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "schedules", "next", "hourly", "--config", str(config_file),
        "--from", "2026-10-24T23:30:00+00:00", "--count", "3",
    )  # fmt: skip
    assert code == 0
    assert out == [
        "2026-10-25T00:00:00+00:00  2026-10-25 02:00:00 CEST (+02:00)",
        "2026-10-25T01:00:00+00:00  2026-10-25 02:00:00 CET (+01:00)",
        "2026-10-25T02:00:00+00:00  2026-10-25 03:00:00 CET (+01:00)",
    ]


@pytest.mark.usefixtures("no_database")
def test_next_defaults_to_five_from_now(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = datetime.now(UTC)
    code, out, _ = run_cli(capsys, "schedules", "next", "hourly", "--config", str(config_file))
    assert code == 0
    instants = [datetime.fromisoformat(line.split()[0]) for line in out]
    assert len(instants) == schedules.DEFAULT_NEXT_COUNT
    assert before < instants[0] <= before + timedelta(hours=1)
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(instants))


@pytest.mark.usefixtures("no_database")
def test_next_shows_the_jittered_run_at_the_ticker_would_use(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(
        capsys, "schedules", "next", "spread", "--config", str(config_file),
        "--from", "2026-11-22T00:00:00Z", "--count", "4",
    )  # fmt: skip
    assert code == 0
    cron = ticker.cron_for("0 * * * *", "Asia/Kathmandu", "spread")
    for line in out:
        utc, _date, _time, abbreviation, offset, run_at, delay = line.split()
        at = datetime.fromisoformat(utc)
        assert at.minute == 15  # :00 at +05:45
        assert (abbreviation, offset, run_at) == ("+0545", "(+05:45)", "run_at")
        expected = ticker.with_jitter(cron, "spread", 30.0, at).run_at - at
        assert delay == f"+{expected.total_seconds():.3f}".rstrip("0").rstrip(".") + "s"
        assert 0 < expected.total_seconds() <= 30


@pytest.mark.usefixtures("no_database")
@pytest.mark.parametrize("when", ["yesterday", "2026-13-01", "22/11/2026"])
def test_next_bad_from_is_one_line_exit_2(
    when: str, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "schedules", "next", "nightly", "--config", str(config_file), "--from", when
    )
    assert (code, out) == (exits.EXIT_USAGE, [])
    assert error_line(err).startswith("pgtick: --from: not an ISO 8601 time")


@pytest.mark.usefixtures("no_database")
def test_next_count_is_capped(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "schedules", "next", "nightly", "--config", str(config_file), "--count", "10001"
    )
    assert code == exits.EXIT_USAGE
    assert "--count" in error_line(err)


def test_next_of_a_schedule_not_in_the_config_needs_a_database(
    config_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGTICK_DSN", raising=False)
    code, _, err = run_cli(capsys, "schedules", "next", "other", "--config", str(config_file))
    assert code == exits.EXIT_USAGE
    line = error_line(err)
    assert "'other' is not declared in" in line
    assert "PGTICK_DSN" in line


def test_backfill_from_after_to_is_refused_before_any_database(
    config_file: Path, capsys: pytest.CaptureFixture[str], no_database: None
) -> None:
    code, _, err = run_cli(
        capsys, "schedules", "backfill", "nightly", "--config", str(config_file),
        "--from", "2026-10-02", "--to", "2026-10-01",
    )  # fmt: skip
    assert code == exits.EXIT_USAGE
    line = error_line(err)
    assert "--from" in line
    assert "--to" in line


@pytest.mark.parametrize(
    ("offset", "text"),
    [
        (0, "+00:00"),
        (2 * 3600, "+02:00"),
        (5 * 3600 + 45 * 60, "+05:45"),
        (-(3 * 3600 + 30 * 60), "-03:30"),
        (-(17 * 60 + 30), "-00:17:30"),  # Amsterdam mean time, before 1937
    ],
)
def test_offsets_are_written_like_iso_8601(offset: int, text: str) -> None:
    assert render.offset_text(timedelta(seconds=offset)) == text


# --- other one-line errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "why"), [("{not json", "invalid JSON"), ("[1, 2]", "must be a JSON object")]
)
def test_enqueue_bad_payload_is_one_line_exit_2(
    payload: str, why: str, config_file: Path, capsys: pytest.CaptureFixture[str], no_database: None
) -> None:
    code, out, err = run_cli(
        capsys, "enqueue", "noop", "--config", str(config_file), "--payload", payload
    )
    assert (code, out) == (exits.EXIT_USAGE, [])
    line = error_line(err)
    assert line.startswith("pgtick: --payload: ")
    assert why in line


BAD_SCHEDULES = [
    ('cron = "61 * * * *"', "cron"),
    ('cron = "0 0 * * * *"', "cron"),
    ('cron = "@reboot"', "cron"),
    ('cron = "0 0 31 2 *"', "cron"),
    ('cron = "0 3 * * *"\ntimezone = "Mars/Olympus"', "timezone"),
    ('cron = "0 3 * * *"\njob_type = "nope"', "job_type"),
]


@pytest.mark.parametrize(("lines", "key"), BAD_SCHEDULES)
def test_check_refuses_a_bad_schedule_naming_its_key(
    lines: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_type = "" if "job_type" in lines else 'job_type = "noop"\n'
    path = tmp_path / "bad.toml"
    path.write_text(
        f'[job_types.noop]\ncommand = ["/bin/true"]\n\n[schedules.broken]\n{job_type}{lines}\n'
    )
    code, out, err = run_cli(capsys, "check", "--config", str(path))
    assert code == exits.EXIT_USAGE
    assert f"schedules.broken.{key}" in error_line(err)
    assert not any("config OK" in line for line in out)


def test_check_accepts_a_good_config(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "check", "--config", str(config_file))
    assert (code, err) == (0, [])
    assert out[-1] == "config OK: 1 job types, 3 schedules"
    assert "schedule nightly: 30 2 * * * (Europe/Amsterdam) -> noop" in out


def test_check_of_a_missing_file_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "check", "--config", str(tmp_path / "missing.toml"))
    assert code == exits.EXIT_USAGE
    assert "cannot read config file" in error_line(err)


def test_an_unexpected_error_is_one_line_not_a_traceback(
    config_file: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(_args: Any) -> int:
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(setup, "cmd_check", boom)
    code, _, err = run_cli(capsys, "check", "--config", str(config_file))
    assert code == exits.EXIT_FAILURE
    assert error_line(err) == "pgtick: internal error: something broke"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UsageError("x"), 2),
        (ConfigError("x"), 2),
        (ScheduleError("x"), 2),
        (DatabaseError("x"), 3),
        (NotFoundError("x"), 4),
        (PgtickError("x"), 1),
        (ValueError("x"), 1),
    ],
)
def test_exit_codes(error: BaseException, code: int) -> None:
    assert exits.exit_code(error) == code


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["statsu"], "unknown 'statsu'; did you mean 'status'?"),
        (["schedules", "pasue", "x"], "unknown 'pasue'; did you mean 'pause'?"),
        (["runs", "--jsno"], "unknown option '--jsno'; did you mean '--json'?"),
        (["prune", "--dry-rn"], "unknown option '--dry-rn'; did you mean '--dry-run'?"),
    ],
)
def test_a_typo_gets_did_you_mean(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 44, item 9: a mistyped verb listed 15 choices and suggested none."""
    with pytest.raises(SystemExit) as stopped:
        parser.build_parser().parse_args(argv)
    assert stopped.value.code == exits.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pgtick: ")
    assert said in err
    assert "choose from" not in err


def test_nothing_close_keeps_argparse_s_list(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser.build_parser().parse_args(["zzzqqq"])
    assert "choose from" in capsys.readouterr().err
