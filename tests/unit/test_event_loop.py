"""The servers' event loop (shardq.common.loop): uvloop's when installed, asyncio's own on
request, and a clear refusal of a loop that cannot be had."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest
import uvloop

from shardq.common.loop import loop_factory, run_main


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_the_servers_run_on_uvloop_by_default(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SHARDQ_EVENT_LOOP", raising=False)
    with caplog.at_level(logging.DEBUG, "shardq.loop"):
        assert run_main(_loop_type()) is uvloop.Loop
    assert caplog.messages == ["event loop: uvloop"]
    monkeypatch.setenv("SHARDQ_EVENT_LOOP", " UVloop ")
    assert run_main(_loop_type()) is uvloop.Loop


def test_asyncio_s_own_loop_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDQ_EVENT_LOOP", "asyncio")
    assert loop_factory() is None
    loop_type = run_main(_loop_type())
    assert issubclass(loop_type, asyncio.BaseEventLoop)
    assert not issubclass(loop_type, uvloop.Loop)


def test_without_uvloop_the_default_is_asyncio_and_asking_for_it_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    monkeypatch.delenv("SHARDQ_EVENT_LOOP", raising=False)
    assert loop_factory() is None
    monkeypatch.setenv("SHARDQ_EVENT_LOOP", "uvloop")
    with pytest.raises(SystemExit, match="uvloop is not installed"):
        loop_factory()


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("shardq.coordinator", ["--database-url", "postgresql://nobody@127.0.0.1:1/none"]),
        ("shardq.shard", ["--redis-url", "redis://127.0.0.1:1", "--shard-id", "0"]),
        ("shardq.worker", ["--handlers", "json", "--coordinator", "127.0.0.1:1"]),
    ],
)
def test_a_server_refuses_an_unknown_loop_by_name(module: str, args: list[str]) -> None:
    """Before it connects to anything: the flags it needs are given, and point nowhere."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        env={"SHARDQ_EVENT_LOOP": "trio", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "SHARDQ_EVENT_LOOP='trio': expected one of uvloop, asyncio" in proc.stderr
