"""``@pgtick.job`` takes the keys of ``[job_types.NAME]`` that apply to a Python handler (all
but ``handler`` and ``command``, which name the handler the decorated function is), checked by
the file's code with the file's messages. It took eight of them, by hand, and refused the
flow-control ones the docs said it took (``job() got an unexpected keyword argument
'max_running'``, exit 2). These tests walk the schema, so a key added to it cannot be left
out of the decorator again."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from pgtick.config import KEYS, Config, Key, config_from_mapping
from pgtick.config.schema import JOB_TYPE_TABLE
from pgtick.core import handlers
from pgtick.errors import ConfigError

# The keys that name a job type's handler: a decorated function is the handler.
HANDLER_KEYS = ("handler", "command")
OPTIONS = [k for k in KEYS if k.table == JOB_TYPE_TABLE and k.name not in HANDLER_KEYS]

# A value of each option other than its default, as the file spells it: a new key of the
# schema needs one here (the test below says so), nothing in the decorator.
SAMPLES: dict[str, Any] = {
    "max_attempts": 4,
    "backoff": "linear",
    "backoff_base": "5s",
    "backoff_max": "2h",
    "jitter": 0.5,
    "timeout": "5m",
    "lease": "90s",
    "output_max_bytes": "8KiB",
    "priority": 7,
    "max_running": 2,
    "concurrency_key": "payload.customer",
    "max_running_per_key": 1,
    "rate": "10/second",
    "rate_per_key": "2/minute",
    "result_from_stdout": True,
    "on_success": "next",
    "on_dead": {"job_type": "alert", "payload": {"to": "ops"}},
}
PREFIX = f"@pgtick.job('dec') in {__name__}"


def _noop(ctx: handlers.JobContext, payload: object) -> None: ...


@pytest.fixture(autouse=True)
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "_DECORATED", {})


def _from_file(options: dict[str, Any]) -> Config:
    table = {"command": ["/bin/true"], **options}
    return config_from_mapping({"job_types": {"dec": table}})


@pytest.mark.parametrize("key", OPTIONS, ids=lambda k: k.name)
def test_the_decorator_takes_every_job_type_key_that_applies(key: Key) -> None:
    assert key.name in SAMPLES, f"add a sample value of job_types.NAME.{key.name} to SAMPLES"
    value = SAMPLES[key.name]
    handlers.job("dec", **{key.name: value})(_noop)
    decorated = handlers.resolve(Config())["dec"].config
    from_file = _from_file({key.name: value}).job_types["dec"]
    assert getattr(from_file, key.field) != key.default  # the sample shows the option applied
    assert getattr(decorated, key.field) == getattr(from_file, key.field)


def test_the_decorators_typed_options_are_the_schemas() -> None:
    """The TypedDict mypy users see for ``**options`` names exactly the keys it takes."""
    from pgtick.config.schema import JOB_OPTION_KEYS, JobOptions

    assert list(typing.get_type_hints(JobOptions)) == [k.name for k in OPTIONS]
    assert list(JOB_OPTION_KEYS) == [k.name for k in OPTIONS]


@pytest.mark.parametrize(
    "options",
    [
        {"max_running": 0},
        {"max_running_per_key": "one"},
        {"rate": "100/day"},
        {"rate_per_key": "/second"},
        {"concurrency_key": "customer"},
        {"priority": 2_000_000},
        {"max_running": 2, "max_running_per_key": 3},
        {"max_attempts": 0},
        {"lease": 5},
    ],
    ids=lambda o: ",".join(o),
)
def test_a_bad_option_is_refused_with_the_files_message(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as in_file:
        _from_file(options)
    handlers.job("dec", **options)(_noop)
    with pytest.raises(ConfigError) as decorated:
        handlers.resolve(Config())
    assert str(decorated.value).replace(PREFIX, "<where>") == str(in_file.value).replace(
        "job_types.dec", "<where>"
    )


@pytest.mark.parametrize("name", HANDLER_KEYS)
def test_handler_and_command_are_not_options(name: str) -> None:
    handlers.job("dec", **{name: "x"})(_noop)  # type: ignore[call-arg]
    with pytest.raises(ConfigError) as err:
        handlers.resolve(Config())
    assert str(err.value) == (
        f"{PREFIX}.{name}: not an option of @pgtick.job (the decorated function is the handler)"
    )


def test_a_misspelt_option_gets_a_suggestion() -> None:
    handlers.job("dec", max_runing=1)(_noop)  # type: ignore[call-arg]
    with pytest.raises(ConfigError) as err:
        handlers.resolve(Config())
    assert str(err.value) == (
        f"{PREFIX}.max_runing: unknown key (did you mean {PREFIX}.max_running?)"
    )


def test_a_schedule_of_a_decorated_type_needs_the_field_its_concurrency_key_reads() -> None:
    handlers.job("dec", concurrency_key="payload.customer")(_noop)
    schedule = {"job_type": "dec", "cron": "* * * * *", "payload": {"other": 1}}
    with pytest.raises(ConfigError) as err:
        handlers.resolve(config_from_mapping({"schedules": {"s": schedule}}))
    assert str(err.value) == (
        f"schedules.s.payload: has no field payload.customer, which {PREFIX}.concurrency_key reads"
    )


def test_a_chain_that_leads_back_through_a_decorated_type_is_refused() -> None:
    """The file's chains are checked for cycles on loading; a decorator's chain can close one
    with the file's (or with itself), which only the daemon's start sees."""
    handlers.job("dec", on_success="filed")(_noop)
    config = config_from_mapping(
        {"job_types": {"filed": {"command": ["/bin/true"], "on_dead": "dec"}}}
    )
    with pytest.raises(ConfigError) as err:
        handlers.resolve(config)
    assert "the chain is a cycle" in str(err.value)
    assert "dec -> filed -> dec" in str(err.value) or "filed -> dec -> filed" in str(err.value)
    handlers.job("self", on_dead={"job_type": "self"})(_noop)
    with pytest.raises(ConfigError, match=r"self -> self"):
        handlers.resolve(Config())


def test_a_decorated_chain_that_ends_is_taken() -> None:
    handlers.job("dec", on_success="filed")(_noop)
    config = config_from_mapping({"job_types": {"filed": {"command": ["/bin/true"]}}})
    assert set(handlers.resolve(config)) == {"dec", "filed"}
