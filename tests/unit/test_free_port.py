"""``free_port()`` hands out ports that nothing else on the machine is about to take, and never
one process the same port twice.

A bind to port 0 and an outgoing connection both get their port from the kernel's local range:
a port picked there could be taken by any process before the server it was picked for binds it.
Picked below that range, and remembered, it cannot: a caller that starts its servers after
taking their ports (``shardq dev``, the tests' helpers) would otherwise start two on one port."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from shardq.coordinator.tools import redis_server
from shardq.coordinator.tools.redis_server import FIRST_PICKED_PORT, free_port

LOCAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_two_thousand_ports_in_a_row_are_all_different_and_free() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing holds it


def test_ports_are_picked_below_the_kernels_local_range() -> None:
    # CI runs on Linux: the range must be there to be read (else this would pass as a no-op).
    low, high = map(int, LOCAL_RANGE.read_text().split())
    ports = [free_port() for _ in range(500)]
    assert all(FIRST_PICKED_PORT <= p < low for p in ports), (low, high, sorted(ports)[-5:])


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # A listener on one port of a band of two: every pick is the other one, until it has been
    # given; then the band holds no port to give.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            other = probe.getsockname()[1]
        band = range(min(taken, other), max(taken, other) + 1, abs(taken - other) or 1)
        monkeypatch.setattr(redis_server, "_picked_band", lambda: band)
        monkeypatch.setattr(redis_server, "_handed_out", type(redis_server._handed_out)(maxlen=8))
        assert free_port() == other
        with pytest.raises(OSError, match="no free port"):
            free_port()


def test_without_the_kernels_range_a_port_comes_from_binding_port_0(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(redis_server, "_LOCAL_RANGE", tmp_path / "missing")
    port = free_port()
    low = int(LOCAL_RANGE.read_text().split()[0])
    assert port >= low  # the kernel's pick, from its range
