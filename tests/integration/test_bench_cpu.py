"""The drain benchmark's CPU split (``bench/peers/_common.py``: ``CpuMeter``): CPU is counted
for the process group it was spent in and for the Redis server it was spent in, not for
another group or another Redis. Real processes burning real CPU; only lower bounds well under
what they burn are asserted (no timing)."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from redis import Redis

from shardq.coordinator.tools.redis_server import RedisProcess

BURN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def _common() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "peers" / "_common.py"
    spec = importlib.util.spec_from_file_location("bench_common", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _session(code: str) -> Iterator[int]:
    """A Python process running ``code`` in a session of its own, as the benchmarks start
    every group of processes; its pid."""
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def other_redis() -> Iterator[RedisProcess]:
    proc = RedisProcess().start()
    try:
        yield proc
    finally:
        proc.cleanup()


def _burn_lua(url: str, seconds: float) -> None:
    """Keep a Redis server busy in a script for ``seconds`` of its own CPU."""
    client = Redis.from_url(url)
    try:
        client.eval(
            "local t = redis.call('TIME'); local stop = t[1] * 1e6 + t[2] + ARGV[1]\n"
            "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop\nreturn 0",
            0,
            int(seconds * 1e6),
        )
    finally:
        client.close()


def test_cpu_is_counted_for_the_group_and_the_redis_that_spent_it(
    redis_proc: RedisProcess, other_redis: RedisProcess
) -> None:
    common = _common()
    with _session("import time; time.sleep(5)") as idle:  # a group that does not burn
        meter = common.CpuMeter({"idle": [idle]}, [redis_proc.port])
        before = meter.mark()
        _burn_lua(redis_proc.url, 0.3)  # counted: the metered Redis
        _burn_lua(other_redis.url, 0.3)  # not counted: another Redis of the machine
        after = meter.mark()
    per_job = common.cpu_per_job_us(before, after, 1)
    assert per_job["cpu_us_per_job_redis"] >= 0.2e6, per_job
    assert per_job["cpu_us_per_job_redis"] < 0.55e6, per_job  # the other Redis's 0.3 s left out
    assert per_job.get("cpu_us_per_job_idle", 0) < 0.1e6, per_job
    assert per_job["cpu_us_per_job"] == pytest.approx(
        sum(v for k, v in per_job.items() if k != "cpu_us_per_job"), abs=1
    )


def test_a_busy_group_is_counted_while_it_runs() -> None:
    common = _common()
    with _session(BURN.format(s=5)) as busy:
        meter = common.CpuMeter({"busy": [busy]})
        before = meter.mark()
        time.sleep(0.5)  # it burns meanwhile (wall time, nothing asserted about it)
        after = meter.mark()
    per_job = common.cpu_per_job_us(before, after, 1)
    assert per_job["cpu_us_per_job_busy"] >= 0.1e6, per_job
