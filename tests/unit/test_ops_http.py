"""The ops endpoint (/metrics, /healthz, /readyz) binds to loopback unless told otherwise:
/metrics names tenants and handlers, so a process started by hand does not publish them to
the network (issue 13's hygiene item); the chart sets 0.0.0.0 for its probes."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry

import shardq.coordinator.server
import shardq.shard.__main__
import shardq.worker.__main__
from shardq.common.ops_http import OpsServer


def non_loopback_address() -> str:
    """This host's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        address: str = s.getsockname()[0]
    assert not address.startswith("127."), address
    return address


async def reachable(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def test_by_default_only_this_host_reaches_the_ops_endpoint() -> None:
    ops = OpsServer(CollectorRegistry(), lambda: (True, {}))
    port = await ops.start(0)
    try:
        assert await reachable("127.0.0.1", port)
        assert not await reachable(non_loopback_address(), port)
    finally:
        await ops.stop()


async def test_metrics_host_opens_it_to_the_network() -> None:
    ops = OpsServer(CollectorRegistry(), lambda: (True, {}), host="0.0.0.0")
    port = await ops.start(0)
    try:
        assert await reachable(non_loopback_address(), port)
    finally:
        await ops.stop()


@pytest.mark.parametrize(
    "program", [shardq.coordinator.server, shardq.shard.__main__, shardq.worker.__main__]
)
def test_every_program_defaults_to_loopback_and_reads_the_variable(
    program: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = program.parse_args  # type: ignore[attr-defined]
    monkeypatch.delenv("SHARDQ_METRICS_HOST", raising=False)
    assert parse([]).metrics_host == "127.0.0.1"
    monkeypatch.setenv("SHARDQ_METRICS_HOST", "0.0.0.0")
    assert parse([]).metrics_host == "0.0.0.0"
    assert parse(["--metrics-host", "::1"]).metrics_host == "::1"
