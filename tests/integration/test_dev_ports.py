"""``shardq dev`` when another program binds a child's metrics port between the moment dev
picked it (``free_port()`` lets it go) and the moment the child binds it: the child exits with
"address already in use", and dev starts it again on a new port, a few times at most.

The cluster runs in this process (as ``shardq dev`` runs it) so that the test can hand dev a
port that a socket here holds; every process it starts is real.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardq.coordinator.tools import redis_server
from shardq.coordinator.tools.dev import DevError, add_arguments
from shardq.coordinator.tools.dev import cluster as dev_cluster
from shardq.coordinator.tools.dev.cluster import PORT_ATTEMPTS, DevCluster
from shardq.coordinator.tools.dev.processes import healthz
from tests.integration.test_dev import free_port_range
from tests.support.postgres import throwaway_database


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port that a listening socket of this process holds for the whole test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def cluster_args(data_dir: Path, database_url: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        [
            "--shards", "1", "--workers", "1", "--no-dashboard", "--no-live",
            "--data-dir", str(data_dir), "--database-url", database_url,
            "--port", str(redis_server.free_port()),
            "--redis-base-port", str(free_port_range(1)),
        ]
    )  # fmt: skip


def handing_out(held: int, times: int | None) -> Callable[[], int]:
    """A free_port() that answers ``held`` on its first ``times`` calls (None: always)."""
    calls = 0

    def pick() -> int:
        nonlocal calls
        calls += 1
        return held if times is None or calls <= times else redis_server.free_port()

    return pick


def test_each_child_that_lost_its_port_is_started_again_on_another(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The coordinator, the shard loop and the worker: each is handed the held port first.
    monkeypatch.setattr(dev_cluster, "free_port", handing_out(held_port, 3))
    with throwaway_database() as url:
        cluster = DevCluster(cluster_args(tmp_path / "dev", url))
        try:
            asyncio.run(cluster.start(asyncio.Event()))
            by_name = {c.name: c for c in cluster.children}
            assert set(by_name) == {"coordinator", "shard-0", "worker-0"}
            for child in by_name.values():
                assert child.lost_ports == 1, child.name
                assert child.proc.poll() is None, child.name
                port = int(str(child.env["SHARDQ_METRICS_PORT"]))
                assert port != held_port
                assert healthz(port) is not None, child.name
                # The log keeps both starts: the clash, then the start that serves.
                log = child.log.read_text()
                assert log.count(f"--- shardq dev: starting {child.name}") == 2
                assert f", {held_port}): address already in use" in log
            assert cluster.pids()["worker-0"] == by_name["worker-0"].pid
        finally:
            cluster.stop()


def test_a_port_lost_on_every_start_ends_the_start_with_the_log(
    tmp_path: Path, held_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dev_cluster, "free_port", handing_out(held_port, None))
    with throwaway_database() as url:
        cluster = DevCluster(cluster_args(tmp_path / "dev", url))
        try:
            with pytest.raises(DevError, match="address already in use") as info:
                asyncio.run(cluster.start(asyncio.Event()))
            child = next(c for c in cluster.children if c.name in str(info.value))
            assert child.lost_ports == PORT_ATTEMPTS
            assert child.log.read_text().count("--- shardq dev: starting") == PORT_ATTEMPTS + 1
        finally:
            cluster.stop()
