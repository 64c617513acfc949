"""``shardq-coordinator --processes N`` (coordinator/processes.py) as a process manager meets
it: N real coordinators behind one port sharing the calls of many clients, each with its own
/metrics; a child that dies takes the whole down with a code; SIGTERM stops them all cleanly;
and a lone coordinator will not share a port it did not ask to share."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from shardq.client import AsyncClient, RetryPolicy
from shardq.coordinator.processes import children_of
from shardq.coordinator.tools.redis_server import free_port
from tests.integration.test_frontdoor_metrics import samples, tokens
from tests.support.coordinator_proc import CoordinatorProcess, one_shard

SUBMITS = "grpc_server_started_total"
PORT_ATTEMPTS = 3
SUBMIT_LABELS = frozenset(
    {
        ("grpc_type", "unary"),
        ("grpc_service", "shardq.v1.JobService"),
        ("grpc_method", "SubmitJob"),
    }
)


def two_free_ports() -> int:
    """A port p with p + 1 free too (the second child's metrics)."""
    for _ in range(100):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two consecutive free ports")


def start(
    database_url: str, port: int, ops_port: int, processes: int, log: Path
) -> subprocess.Popen[bytes]:
    """The coordinator (its stderr, with the children's, to ``log``)."""
    env = {
        **os.environ,
        "SHARDQ_LISTEN": f"127.0.0.1:{port}",
        "SHARDQ_METRICS_PORT": str(ops_port),
        "SHARDQ_DATABASE_URL": database_url,
        "SHARDQ_KEY_PREFIX": "sq",
        "SHARDQ_SHUTDOWN_GRACE_S": "1",
        "SHARDQ_LOG_LEVEL": "WARNING",
        "SHARDQ_PROCESSES": str(processes),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "shardq.coordinator.server"], env=env, stderr=out
        )


async def up(proc: subprocess.Popen[bytes], port: int, ops_ports: list[int]) -> None:
    for ops in ops_ports:
        child = CoordinatorProcess(proc, port, ops, "", "")
        for _ in range(300):
            assert proc.poll() is None, f"exited with {proc.returncode}"
            if (await asyncio.to_thread(child.http, "/healthz"))[0] == 200:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"no /healthz on {ops}")


@asynccontextmanager
async def coordinators(
    database_url: str, processes: int, log: Path
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int, int]]:
    """``shardq-coordinator --processes N`` on a one-shard cluster, each child's /healthz up;
    (its process, its gRPC port, the first child's metrics port). Killed after if still up."""
    async with one_shard(database_url):
        for _ in range(PORT_ATTEMPTS):
            port, ops = free_port(), two_free_ports()
            seen = size_of(log)
            proc = start(database_url, port, ops, processes, log)
            try:
                try:
                    await up(proc, port, [ops + i for i in range(processes)])
                except AssertionError:
                    if proc.poll() is None or not lost_a_port(log, seen):
                        raise
                    continue  # another process took a port after free_port() let it go
                yield proc, port, ops
                return
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        raise AssertionError(f"{PORT_ATTEMPTS} starts each lost a port to another process")


def size_of(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def lost_a_port(log: Path, since: int) -> bool:
    """Whether the start logged from byte ``since`` of ``log`` on failed to bind a port."""
    with log.open("rb") as f:
        f.seek(since)
        return b"address already in use" in f.read().lower()


async def test_two_processes_share_the_port_and_the_calls(
    database_url: str, tmp_path: Path
) -> None:
    async with coordinators(database_url, 2, tmp_path / "log") as (proc, port, ops):
        (token,) = await tokens(database_url, "acme")
        assert len(children_of(proc.pid)) == 2

        async def one_client(n: int) -> None:
            # A connection of its own, as a client in another process would have (channels of
            # one process to one target share a connection by default); the kernel picks
            # which coordinator process accepts it.
            own = [("grpc.use_local_subchannel_pool", 1)]
            async with AsyncClient(
                f"127.0.0.1:{port}", token, retry=RetryPolicy(), channel_options=own
            ) as c:
                for i in range(10):
                    await c.submit("test.work", {"n": i}, request_id=f"c{n}-{i}")

        await asyncio.gather(*(one_client(n) for n in range(20)))
        counts = []
        for metrics_port in (ops, ops + 1):
            child = CoordinatorProcess(proc, port, metrics_port, "", "")
            status, body = await asyncio.to_thread(child.http, "/metrics")
            assert status == 200
            counts.append(samples(body.decode()).get((SUBMITS, SUBMIT_LABELS), 0.0))
        assert sum(counts) == 200, counts
        assert all(c > 0 for c in counts), counts  # both took connections (2 * 2^-20 odds)

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0


async def test_a_child_that_dies_takes_the_others_down_with_its_code(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    async with coordinators(database_url, 2, log) as (proc, _, _):
        first, second = children_of(proc.pid)
        os.kill(first, signal.SIGKILL)
        assert await asyncio.to_thread(proc.wait, 30) == 128 + signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            for _ in range(100):
                os.kill(second, 0)  # still there while it drains
                await asyncio.sleep(0.1)
        assert "exited with -9: stopping the others" in log.read_text()


async def test_a_lone_coordinator_will_not_share_a_port_in_use(
    database_url: str, tmp_path: Path
) -> None:
    async with coordinators(database_url, 1, tmp_path / "first") as (_, port, _):
        second = start(database_url, port, free_port(), 1, tmp_path / "second")
        assert await asyncio.to_thread(second.wait, 60) == 1
        assert "cannot listen on 127.0.0.1:" in (tmp_path / "second").read_text()
    refused = start(database_url, 0, free_port(), 2, tmp_path / "refused")
    assert await asyncio.to_thread(refused.wait, 60) == 1
    assert "--processes needs a fixed --listen port" in (tmp_path / "refused").read_text()
