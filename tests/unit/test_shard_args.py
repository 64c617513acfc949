"""``shardq-shard``'s numeric flags: a value outside what the loop can run with is refused at
start, naming the flag, from the command line and from its variable alike; the limits
themselves are accepted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardq.shard.__main__ import parse_args

BAD = [
    ("--shard-id", "-1", "0 or more"),
    ("--reconcile-interval-s", "-0.5", "0 or more"),
    ("--precheck-ahead-ms", "-1", "0 or more"),
    ("--promote-ahead-ms", "-1", "0 to 10000"),
    ("--promote-ahead-ms", "10001", "0 to 10000"),
    ("--leader-ttl-ms", "0", "1 or more"),
    ("--reap-interval-ms", "0", "1 or more"),
    ("--load-interval-s", "-1", "0 or more"),
    ("--load-top-tenants", "-1", "0 or more"),
]


@pytest.mark.parametrize(("flag", "value", "allowed"), BAD)
def test_a_value_out_of_range_is_refused_naming_the_flag(
    flag: str, value: str, allowed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args([f"{flag}={value}"])
    assert exit_.value.code == 2
    assert f"{flag} must be {allowed} (got {value})" in capsys.readouterr().err


def test_the_variable_is_held_to_the_same_range(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHARDQ_PROMOTE_AHEAD_MS", "-20")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "--promote-ahead-ms must be 0 to 10000 (got -20)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--promote-ahead-ms", "0", "--precheck-ahead-ms", "0", "--reconcile-interval-s", "0"],
        ["--promote-ahead-ms", "10000", "--leader-ttl-ms", "1", "--reap-interval-ms", "1"],
        ["--load-interval-s", "0", "--load-top-tenants", "0", "--shard-id", "0"],
    ],
)
def test_the_limits_themselves_are_accepted(argv: list[str]) -> None:
    args = parse_args(argv)
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        assert getattr(args, flag[2:].replace("-", "_")) == float(value)


def test_the_installed_command_refuses_it_before_reaching_redis() -> None:
    """The real ``shardq-shard``, pointed at a Redis that is not there: it exits on the flag
    at once (status 2, the flag named), not on the connection."""
    command = Path(sys.executable).parent / "shardq-shard"
    done = subprocess.run(
        [str(command), "--redis-url", "redis://127.0.0.1:1/0", "--promote-ahead-ms", "-5"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "shardq-shard: error: --promote-ahead-ms must be 0 to 10000 (got -5)" in done.stderr
