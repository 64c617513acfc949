"""``free_port()`` never hands one process the same port twice: the kernel picks each port
for a bind to port 0 at random among the odd ports of its local range (~14,000 here), so 2,000
picks repeat one about a hundred times, and a caller that starts its servers after taking their
ports (``shardq dev``, the tests' helpers) would start two on one port."""

from __future__ import annotations

import socket

from shardq.coordinator.tools.redis_server import free_port


def test_two_thousand_ports_in_a_row_are_all_different_and_free() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing holds it
