"""The bench harness's pure helpers and its usage errors (no database: they fail before one
is started)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from bench import common, throughput

REPO = Path(__file__).resolve().parents[2]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert common.percentile(values, 50) == 50.0
    assert common.percentile(values, 99) == 99.0
    assert common.percentile(values, 100) == 100.0
    assert common.percentile([7.0], 99) == 7.0
    assert common.percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_distribution_of_nothing_has_only_a_count() -> None:
    assert common.distribution([]) == {"n": 0}
    stats = common.distribution([1.0, 2.0, 3.0, 4.0])
    assert (stats["n"], stats["min"], stats["max"], stats["mean"]) == (4, 1.0, 4.0, 2.5)


def test_cpu_per_run_counts_what_each_process_used_meanwhile() -> None:
    before = {"daemon": {10: 1.0}, "server": {20: 2.0, 21: 0.5}}
    # 20 used 1 s more, 21 came and went (not counted), 22 is new (all of it counted)
    after = {"daemon": {10: 3.0}, "server": {20: 3.0, 22: 0.5}}
    assert throughput.cpu_per_run(before, after, 100_000) == {
        "daemon_cpu_us_per_run": 20.0,
        "server_cpu_us_per_run": 15.0,
    }
    nothing = {"daemon": {10: 3.0}, "server": {}}
    assert throughput.cpu_per_run(before, nothing, 10)["server_cpu_us_per_run"] is None


def test_process_cpu_reads_only_the_named_command() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        used, deadline = 0.0, time.monotonic() + 10
        while used < 0.05 and time.monotonic() < deadline:  # /proc counts clock ticks
            used = throughput.process_cpu(busy.pid) or 0.0
            time.sleep(0.01)
        assert used >= 0.05
        assert throughput.process_cpu(busy.pid, "postgres") is None  # a python process
    finally:
        busy.kill()
        busy.wait()
    assert throughput.process_cpu(busy.pid) is None  # gone


def test_settings_are_grouped_by_section_and_typed() -> None:
    settings = common.parse_settings(
        ["worker.threads=16", "worker.lease=6s", "ticker.reaper_interval=2", "logging.x=true"]
    )
    assert settings == {
        "worker": {"threads": 16, "lease": "6s"},
        "ticker": {"reaper_interval": 2},
        "logging": {"x": True},
    }
    assert common.merged(settings, {"worker": {"threads": 8}})["worker"] == {
        "threads": 8,
        "lease": "6s",
    }


@pytest.mark.parametrize("item", ["threads=8", "worker.=8", "worker.threads"])
def test_a_setting_without_section_key_and_value_is_a_usage_error(item: str) -> None:
    with pytest.raises(common.BenchError) as info:
        common.parse_settings([item])
    assert info.value.code == 2


def test_generated_config_keeps_defaults_and_adds_the_given_keys(tmp_path: Path) -> None:
    path = common.write_config(
        tmp_path / "c.toml", {"worker": {"threads": 4, "lease": "6s"}}, extra="[schedules]\n"
    )
    text = path.read_text()
    assert 'imports = ["bench.jobs"]' in text
    assert "threads = 4\n" in text and 'lease = "6s"\n' in text
    assert "prefetch" not in text
    with pytest.raises(common.BenchError):
        common.write_config(tmp_path / "d.toml", {"database": {"pool_size": 2}})


def test_table_aligns_numbers_right() -> None:
    lines = common.table(["name", "n"], [["a", 1000], ["bb", 5]]).splitlines()
    assert lines == ["name      n", "----  -----", "a     1,000", "bb        5"]


def run_bench(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nfrom bench.__main__ import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["latency", "--runs", "5"], "--runs must be at least 200"),
        (["throughput", "--set", "threads"], "expected section.key=value"),
        (["throughput", "--sweep", "--threads-list", "8,x"], "--threads-list"),
        (["recovery", "--set", "worker.lease=soon"], "worker.lease"),
        (["peers", "--only", "celery"], "unknown peers ['celery']"),
        (["peers", "--rounds", "0"], "--rounds must be at least 1"),
        (["queue-health", "--pin", "30"], "--pin must each be at least one --window"),
        (["queue-health", "--rate", "0"], "--rate and --window must be positive"),
        (["queue-health", "--set", "web.listen=x"], "--set: worker, ticker, logging, database"),
        (["soak", "--sample", "60", "--retention", "30s"], "--sample must be shorter"),
        (["soak", "--retention", "2 minutes"], "expected a duration such as 2m"),
        (["soak", "--duration", "30", "--sample", "60"], "--sample must not exceed --duration"),
        (["soak", "--minutes", "0.5", "--sample", "60"], "--sample must not exceed --duration"),
        (["soak", "--duration", "300", "--minutes", "5"], "--duration or --minutes, not both"),
        (["queue-health", "--pin", "300", "--minutes", "5"], "--pin or --minutes, not both"),
        (["queue-health", "--minutes", "0.5"], "--pin must each be at least one --window"),
        (["soak", "--setup-sql", "/nonexistent.sql"], "--setup-sql /nonexistent.sql: no such"),
        (["soak", "--server", "15", "--dsn", "host=x"], "--dsn and --server: one or the other"),
        (["soak", "--server", "99"], "--server 99: no PostgreSQL 99 under /usr/lib/postgresql"),
        (["idle", "--server", "latest"], "expected embedded or a major version"),
        (["output", "--runs", "0"], "--runs and --rounds must be at least 1"),
        (["output", "--set", "web.listen=x"], "--set: only worker.*, ticker.* and logging.*"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = run_bench(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr


@pytest.mark.parametrize(
    ("args", "module"),
    [
        (["peers", "--runs", "10"], "procrastinate"),
        (["queue-health", "--system", "both"], "pgqueuer"),
    ],
)
def test_a_missing_peer_package_fails_naming_it(args: list[str], module: str) -> None:
    result = run_bench(*args, prelude=f"sys.modules[{module!r}] = None")
    assert result.returncode == 2
    assert result.stderr.startswith(f"bench {args[0]}: cannot import {module}")
    assert "pip install -e '.[bench]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_server_exits_3_naming_the_option() -> None:
    result = run_bench("idle", "--dsn", "postgresql://nobody@127.0.0.1:1/postgres")
    assert result.returncode == 3
    assert result.stderr.startswith("bench idle: --dsn: database unreachable")
    assert "Traceback" not in result.stderr


def test_both_parts_explain_themselves_in_help() -> None:
    for part in ("queue-health", "soak"):
        result = run_bench(part, "--help")
        assert result.returncode == 0
        assert "--json" in result.stdout and "--rate" in result.stdout
