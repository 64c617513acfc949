"""Shard map changes that cannot wedge the cluster (issue 14): every new or changed address is
checked before anything commits, a change whose target died before copying can be aborted,
a shard can be re-pointed at a Redis that holds its data, and running coordinators follow
removals and address changes. The ``shardq`` command runs as a subprocess, as an operator
runs it; the coordinator is a real gRPC server on real redis-server shards and Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shardq.client import AsyncClient
from shardq.common.errors import Unavailable
from shardq.coordinator.errors import translate
from shardq.coordinator.router import ShardRedis
from shardq.coordinator.shardmap import ShardMapStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port
from shardq.store import db
from tests.support.cluster import Cluster, running_cluster
from tests.support.workers import running_worker, wait_for_rows

pytestmark = pytest.mark.timeout(180)


@dataclass
class Run:
    code: int
    out: str
    err: str


async def shardq(cluster: Cluster, *words: str, ops: bool = True) -> Run:
    """``shardq WORDS...`` as a subprocess: an operator command (database, key prefix, --yes)
    or, with ``ops=False``, an API command through the running coordinator."""
    if ops:
        extra = ["--database-url", cluster.database_url, "--key-prefix", "sq", "--yes"]
    else:
        extra = ["--coordinator", cluster.target, "--token", cluster.admin_token]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "shardq.coordinator.cli", *words, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def one_line(run: Run) -> str:
    """The one line a refused operator command prints (exit status 1, no traceback)."""
    assert run.code == 1, run
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.err, run.err
    assert lines[0].startswith("shardq: error: "), lines[0]
    return lines[0]


async def version(cluster: Cluster) -> int:
    engine = db.make_engine(cluster.database_url)
    try:
        return await ShardMapStore(engine).version()
    finally:
        await engine.dispose()


async def wait_for_version(cluster: Cluster, at_least: int) -> None:
    await cluster.coordinator.follower.wait_for_version(at_least, 30)


def tenants_on(cluster: Cluster, shard_id: int, count: int, prefix: str = "t") -> list[str]:
    smap = cluster.coordinator.shard_map
    names = (f"{prefix}{i}" for i in range(100_000))
    found = [t for t in names if smap.shard_for(t) == shard_id]
    return found[:count] if len(found) >= count else pytest.fail("not enough tenants")


async def submit(client: AsyncClient, request_id: str) -> str:
    job = await client.submit("test.work", {"n": request_id}, request_id=request_id)
    return job.job_id


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """A tiny HTTP server on a free port: what the README's 10.0.0.7:6379 turned out to be."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.asynccontextmanager
async def redis_process(*extra: str, appendonly: bool = True) -> AsyncIterator[RedisProcess]:
    proc = RedisProcess(appendonly=appendonly, extra_args=list(extra))
    await asyncio.to_thread(proc.start)
    try:
        yield proc
    finally:
        proc.cleanup()


# -- the checks ---------------------------------------------------------------------------


async def test_an_address_that_fails_a_check_is_refused_with_one_line_and_nothing_commits(
    database_url: str,
) -> None:
    async with (
        running_cluster(database_url) as cluster,
        redis_process(appendonly=False) as no_aof,
        redis_process("--maxmemory-policy", "allkeys-lru") as evicting,
        redis_process() as foreign,
        redis_process() as old_marked,
    ):
        r = Redis(port=foreign.port)
        await r.set("sessions:42", "someone else's")
        await r.aclose()
        r = Redis(port=old_marked.port)
        await r.set("sq:identity", "0")  # holds shard 0's data
        await r.aclose()
        start = await version(cluster)
        nothing = free_port()
        with http_server() as http_port:
            cases = {
                f"127.0.0.1:{nothing}": "cannot connect",
                f"127.0.0.1:{http_port}": "does not answer as Redis",
                f"127.0.0.1:{no_aof.port}": "appendonly is off",
                f"127.0.0.1:{evicting.port}": "maxmemory-policy is allkeys-lru",
                f"127.0.0.1:{foreign.port}": "holds keys that are not shardq's",
                f"127.0.0.1:{old_marked.port}": "holds the data of shard 0, not of shard 2",
            }
            for address, why in cases.items():
                line = one_line(await shardq(cluster, "shards", "add", address))
                assert f"{address}: {why}" in line, line
        # The same checks guard sync: one new address among good ones.
        good = [f"127.0.0.1:{s.port}" for s in cluster.shards]
        run = await shardq(cluster, "shards", "sync", *(f"--address={a}" for a in good),
                           f"--address=127.0.0.1:{nothing}")  # fmt: skip
        assert f"127.0.0.1:{nothing}: cannot connect" in one_line(run)
        assert await version(cluster) == start
        assert len((await ShardMapStore(cluster.coordinator.engine).load()).shards) == 2


async def test_a_submit_to_a_shard_that_is_down_is_unavailable_naming_the_shard_not_its_address(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        tenant = tenants_on(cluster, 1, 1)[0]
        client = await cluster.client(tenant)
        await submit(client, "before")
        cluster.shards[1].kill()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(client, "after")  # the cluster's clients make one attempt
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == "shard 1 unreachable"


# -- a change whose target died: moves run fails cleanly, moves abort undoes it ------------


async def test_moves_abort_undoes_an_added_shard_that_died_before_copying(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster, redis_process() as doomed:
        tenants = [f"t{i}" for i in range(24)]
        clients = {t: await cluster.client(t) for t in tenants}
        job_ids = {t: await submit(clients[t], f"{t}-1") for t in tenants}
        start = await version(cluster)
        address = f"127.0.0.1:{doomed.port}"
        added = await shardq(cluster, "shards", "add", address, "--no-move")
        assert added.code == 0, added.err
        await wait_for_version(cluster, start + 1)
        marker: Any = Redis(port=doomed.port)
        assert await marker.get("sq:identity") == b"2"  # it holds shard 2's data from now on
        await marker.aclose()
        moving = sorted(cluster.coordinator.shard_map.moves)
        assert moving, "some tenants' slots went to the new shard"
        doomed.kill()

        # The mover stops with one line naming the shard; nothing is half-done.
        run = await shardq(cluster, "moves", "run")
        line = one_line(run)
        assert f"shard 2 ({address}) unreachable" in line, line
        assert "moves abort" in line
        # The moving tenants' submits go to the dead target meanwhile: UNAVAILABLE, named.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(clients[moving[0]], f"{moving[0]}-2")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert caught.value.details() == "shard 2 unreachable"

        aborted = await shardq(cluster, "moves", "abort")
        assert aborted.code == 0, aborted.err
        assert f"abort move of tenant {moving[0]}: back to shard" in aborted.out
        await wait_for_version(cluster, start + 2)
        smap = cluster.coordinator.shard_map
        assert not smap.moves
        for t in tenants:
            assert smap.shard_for(t) in (0, 1), t
            await submit(clients[t], f"{t}-2")  # accepted again, on its old shard
            assert (await clients[t].get(job_ids[t])).job_id == job_ids[t]

        # The dead shard can then be taken out (only knowingly: it cannot be checked).
        refused = one_line(await shardq(cluster, "shards", "remove", "2"))
        assert "shard 2 (" in refused and "--forget-unreachable" in refused, refused
        removed = await shardq(cluster, "shards", "remove", "2", "--forget-unreachable")
        assert removed.code == 0, removed.err
        await wait_for_version(cluster, start + 3)
        assert sorted(cluster.coordinator.shard_map.shards) == [0, 1]
        stats = await shardq(cluster, "stats", "--all", ops=False)
        assert stats.code == 0, stats.err
        assert all(t in stats.out for t in tenants)


async def test_moves_abort_refuses_once_copying_has_started(database_url: str) -> None:
    async with running_cluster(database_url) as cluster:
        tenant = tenants_on(cluster, 0, 1)[0]
        client = await cluster.client(tenant)
        await submit(client, "a")
        moved = await shardq(cluster, "tenants", "move", tenant, "1", "--no-move")
        assert moved.code == 0, moved.err
        # What a mover killed after its first step leaves: the job taken off the queues.
        r: Any = Redis(port=cluster.shards[0].port)
        await r.sadd(f"sq:moving:{tenant}", "some-job")
        await r.aclose()
        line = one_line(await shardq(cluster, "moves", "abort"))
        assert f"copying has started for tenants {tenant}" in line, line
        assert tenant in (await ShardMapStore(cluster.coordinator.engine).load()).moves


# -- a removed shard leaves running coordinators --------------------------------------------


async def test_stats_all_works_through_a_running_coordinator_after_a_shard_is_removed(
    database_url: str,
) -> None:
    async with running_cluster(database_url, shard_count=3) as cluster:
        tenants = tenants_on(cluster, 2, 2) + tenants_on(cluster, 0, 1)
        for t in tenants:
            await submit(await cluster.client(t), f"{t}-1")
        start = await version(cluster)
        drained = await shardq(cluster, "shards", "drain", "2")
        assert drained.code == 0, drained.err
        removed = await shardq(cluster, "shards", "remove", "2")
        assert removed.code == 0, removed.err
        cluster.shards[2].stop()
        await wait_for_version(cluster, start + 2)
        stats = await shardq(cluster, "stats", "--all", ops=False)
        assert stats.code == 0, stats.err
        assert all(t in stats.out for t in tenants)


# -- re-pointing a shard at the Redis that holds its data -----------------------------------


async def copy_of(source: RedisProcess, target: RedisProcess) -> None:
    """Make ``target`` hold ``source``'s data (a replica, then promoted): the Redis moved."""
    r: Any = Redis(port=target.port)  # redis-py's command methods are loosely typed
    try:
        await r.execute_command("REPLICAOF", "127.0.0.1", str(source.port))
        async with asyncio.timeout(30):
            while (await r.info("replication")).get("master_link_status") != "up":
                await asyncio.sleep(0.05)
            src = Redis(port=source.port)
            while await r.dbsize() != await src.dbsize():
                await asyncio.sleep(0.05)
            await src.aclose()
        await r.execute_command("REPLICAOF", "NO", "ONE")
    finally:
        await r.aclose()


async def test_set_address_and_sync_repoint_a_shard_and_running_coordinators_and_workers_follow(
    database_url: str,
) -> None:
    async with (
        running_cluster(database_url) as cluster,
        redis_process() as empty,
        redis_process() as moved_once,
        redis_process() as moved_twice,
    ):
        tenant = tenants_on(cluster, 1, 1)[0]
        client = await cluster.client(tenant)
        first = await submit(client, "first")
        start = await version(cluster)
        old = cluster.shards[1]

        # An empty Redis does not hold shard 1's data: refused (shard 1 owns slots).
        line = one_line(await shardq(cluster, "shards", "set-address", "1",
                                     f"127.0.0.1:{empty.port}"))  # fmt: skip
        assert f"127.0.0.1:{empty.port}: holds no data of shard 1" in line, line
        # ...nor does shard 0's Redis (marked as shard 0 by the command above).
        line = one_line(await shardq(cluster, "shards", "set-address", "1",
                                     f"127.0.0.1:{cluster.shards[0].port}"))  # fmt: skip
        assert "shard 0 is at" in line, line
        assert await version(cluster) == start

        await copy_of(old, moved_once)
        run = await shardq(cluster, "shards", "set-address", "1", f"127.0.0.1:{moved_once.port}")
        assert run.code == 0, run.err
        assert f"address 127.0.0.1:{old.port} -> 127.0.0.1:{moved_once.port}" in run.out
        await wait_for_version(cluster, start + 1)
        old.stop()
        async with running_worker(cluster):
            # The coordinator reads and writes the shard at its new address, no restart...
            assert (await client.get(first)).job_id == first
            second = await submit(client, "second")
            # ...and the worker claims there: both jobs end with their result rows.
            await wait_for_rows(cluster.database_url, 2)

            # `shards sync` re-points too: the config's address for shard 1 changed.
            await copy_of(moved_once, moved_twice)
            addresses = [f"127.0.0.1:{cluster.shards[0].port}", f"127.0.0.1:{moved_twice.port}"]
            run = await shardq(cluster, "shards", "sync", *(f"--address={a}" for a in addresses))
            assert run.code == 0, run.err
            await wait_for_version(cluster, start + 2)
            moved_once.stop()
            assert (await client.get(second)).job_id == second
            await submit(client, "third")
            await wait_for_rows(cluster.database_url, 3)


async def test_moves_abort_of_a_pin_unpins_and_refuses_once_the_target_took_a_submit(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        quiet, busy = tenants_on(cluster, 0, 2)
        for t in (quiet, busy):
            await submit(await cluster.client(t), f"{t}-1")
            moved = await shardq(cluster, "tenants", "move", t, "1", "--no-move")
            assert moved.code == 0, moved.err
        start = await version(cluster)
        await wait_for_version(cluster, start)
        await submit(await cluster.client(busy), f"{busy}-2")  # lands on the target, shard 1

        line = one_line(await shardq(cluster, "moves", "abort"))
        assert f"tenants {busy} already have jobs on their target shard" in line, line
        assert await version(cluster) == start

        aborted = await shardq(cluster, "moves", "abort", quiet)
        assert aborted.code == 0, aborted.err
        await wait_for_version(cluster, start + 1)
        smap = cluster.coordinator.shard_map
        assert quiet not in smap.pins and quiet not in smap.moves  # its slot says shard 0
        assert smap.shard_for(quiet) == 0 and smap.moves[busy].to_shard_id == 1
        await submit(await cluster.client(quiet), f"{quiet}-2")


async def test_a_shard_that_answers_http_is_unavailable_to_clients_never_internal() -> None:
    """What the coordinator made of `Protocol error, got "H"`: INTERNAL before issue 14."""
    with http_server() as port:
        redis: Any = ShardRedis.open(2, f"127.0.0.1:{port}", "")
        try:
            with pytest.raises(RedisError) as caught:
                await redis.ping()
        finally:
            await redis.aclose()
    assert "Protocol error" in str(caught.value)
    err = translate(caught.value)
    assert isinstance(err, Unavailable) and str(err) == "shard 2 unreachable"
