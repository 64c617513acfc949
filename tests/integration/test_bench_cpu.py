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


def _burn_lua(url: str, loops: int) -> float:
    """Keep a Redis server busy in a script of ``loops`` steps; the server's CPU seconds it
    took, by its own count (``INFO cpu``). No clock in the script: Valkey's TIME stands still
    while a script runs."""
    client = Redis.from_url(url)

    def cpu_s() -> float:
        info = client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    try:
        before = cpu_s()
        client.eval(
            "local x = 0\nfor i = 1, tonumber(ARGV[1]) do x = x + i end\nreturn 0", 0, loops
        )
        return cpu_s() - before
    finally:
        client.close()


def test_cpu_is_counted_for_the_group_and_the_redis_that_spent_it(
    redis_proc: RedisProcess, other_redis: RedisProcess
) -> None:
    common = _common()
    with _session("import time; time.sleep(30)") as idle:  # a group that does not burn
        meter = common.CpuMeter({"idle": [idle]}, [redis_proc.url])
        before = meter.mark()
        metered = _burn_lua(redis_proc.url, 40_000_000)  # counted: the metered Redis
        other = _burn_lua(other_redis.url, 80_000_000)  # not counted: another Redis
        after = meter.mark()
    per_job = common.cpu_per_job_us(before, after, 1)
    counted = per_job["cpu_us_per_job_redis"] / 1e6
    assert other > 0.1, other  # the other Redis burned enough to show, had it been counted
    # The metered Redis's own count, give or take the clock ticks /proc counts in.
    assert abs(counted - metered) <= 0.05 + 0.2 * metered, (counted, metered, other)
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
