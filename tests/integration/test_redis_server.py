"""coordinator/tools/redis_server.py: a redis-server and a sentinel started, refused and
cleaned up by the one piece of code they share."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shardq.coordinator.tools.redis_server import RedisProcess, SentinelProcess


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True


def test_a_redis_server_and_its_sentinel_start_stop_and_leave_nothing_behind() -> None:
    redis = RedisProcess().start()
    sentinel = SentinelProcess("m", redis.port).start()
    dirs = [redis.data_dir, Path(sentinel._owned_dir.name) if sentinel._owned_dir else None]
    try:
        assert _listening(redis.port)
        assert _listening(sentinel.port)
    finally:
        sentinel.cleanup()
        redis.cleanup()
    assert sentinel.proc is None
    assert redis.proc is None
    assert not _listening(redis.port)
    assert not _listening(sentinel.port)
    for d in dirs:
        assert d is not None
        assert not d.exists()


def test_a_process_that_exits_at_start_is_reported_with_its_error() -> None:
    redis = RedisProcess(extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match=r"redis-server exited with [1-9]"):
        redis.start()
    assert redis.proc is None
    redis.cleanup()
    bad = SentinelProcess("m", 6379, quorum=0)  # refused: a quorum must be at least 1
    with pytest.raises(RuntimeError, match="redis sentinel exited with"):
        bad.start()
    assert bad.proc is None
    bad.cleanup()
