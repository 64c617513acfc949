"""A shard that survives losing its primary: Redis Sentinel fails over to a replica, shardq
follows it through the shard's ``sentinel://`` address, and no acknowledged submit is lost.

Each shard here is a primary redis-server (AOF), its replicas and three sentinels, all real
processes, with the fencing the chart sets (``min-replicas-to-write 1``): the coordinator (a
real gRPC server), a shard loop and workers (processes) reach the shard only through the
sentinels, and every write they acknowledge waits for a replica (``--shard-replicas-to-ack 1``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shardq.client import RetryPolicy
from shardq.common.errors import ShardqError, Unavailable
from shardq.common.redis import MASTER_CHECK_INTERVAL_S, Durability, NotReplicated, redis_for
from shardq.coordinator import cli
from shardq.coordinator.app import Coordinator, CoordinatorSettings
from shardq.coordinator.server import build_server
from shardq.coordinator.shardcheck import AddressRefused, ShardChecker
from shardq.coordinator.shardmap import ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.faults import CuttableProxy
from shardq.coordinator.tools.reconcile import Accepted, settle
from shardq.coordinator.tools.redis_server import (
    RedisProcess,
    SentinelProcess,
    free_port,
    parent_death_prefix,
)
from shardq.shard import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.models import Lease, NewJob, ShardSettings
from shardq.shard.records import JobState
from shardq.store.migrate import upgrade
from tests.support.cluster import Cluster, wait_until_listening
from tests.support.handlers import executions_in
from tests.support.procs import WorkerProcess, start_worker, wait_until_serving

PREFIX = "sq"
#: What the chart sets on every shard Redis: a primary that has lost its replicas for this
#: long stops taking writes (it may be the stale side of a partition).
FENCE = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "2"]
DURABLE = Durability(replicas=1, timeout_ms=1_000)


@dataclass
class ShardGroup:
    """One shard: a primary, its replicas and three sentinels watching them."""

    name: str
    primary: RedisProcess
    replicas: list[RedisProcess]
    sentinels: list[SentinelProcess]

    @property
    def address(self) -> str:
        return f"sentinel://{','.join(s.address for s in self.sentinels)}/{self.name}"

    @property
    def redis_processes(self) -> list[RedisProcess]:
        return [self.primary, *self.replicas]

    async def master_port(self, sentinel: int = 0) -> int:
        """The primary's port as sentinel ``sentinel`` (the first by default) names it now."""
        async with _client(self.sentinels[sentinel].port) as s:
            _, port = await s.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        return int(port)

    def cleanup(self) -> None:
        for p in self.sentinels:
            p.cleanup()
        for r in self.redis_processes:
            r.cleanup()


@contextlib.asynccontextmanager
async def _client(port: int) -> AsyncIterator[Any]:
    r = Redis(port=port, socket_connect_timeout=1, socket_timeout=5)
    try:
        yield r
    finally:
        await r.aclose()


async def _info(port: int, section: str = "replication") -> dict[str, Any]:
    async with _client(port) as r:
        info: dict[str, Any] = await r.info(section)
        return info


async def _wait_for(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    """Poll ``check()`` (async) until it returns a truthy value; fail naming ``what``."""
    last: object = None
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                try:
                    last = await check()
                except (RedisError, OSError) as exc:
                    last = exc  # not yet: an error is no answer (however truthy)
                else:
                    if last:
                        return last
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})") from None


async def start_group(
    name: str,
    replicas: int,
    *,
    fence: bool = True,
    through: CuttableProxy | None = None,
    primary_args: Sequence[str] = (),
) -> ShardGroup:
    """A primary, ``replicas`` replicas and three sentinels; with ``fence`` the chart's
    ``min-replicas-to-write``; with ``through``, a proxy to the primary's port (not started
    yet), the replicas replicate through it (so a test can cut them off)."""
    args = FENCE if fence else []
    primary = RedisProcess(port=free_port(), extra_args=[*args, *primary_args])
    follow_port = primary.port
    if through is not None:
        through.target = ("127.0.0.1", primary.port)
        follow_port = await through.start()
    primary.start()
    group = ShardGroup(name, primary, [], [])
    try:
        for _ in range(replicas):
            follow = ["--replicaof", "127.0.0.1", str(follow_port)]
            group.replicas.append(RedisProcess(extra_args=[*args, *follow]).start())

        async def good_replicas() -> bool:
            info = await _info(primary.port)
            synced = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            return sum(1 for v in synced if v.get("state") == "online") >= replicas

        await _wait_for("the replicas in sync", good_replicas)
        group.sentinels = [SentinelProcess(name, primary.port).start() for _ in range(3)]

        async def sentinels_know_all() -> bool:
            for s in group.sentinels:
                async with _client(s.port) as r:
                    m = await r.execute_command("SENTINEL", "MASTER", name)
                fields = dict(zip(m[::2], m[1::2], strict=True)) if isinstance(m, list) else m
                if int(fields[b"num-other-sentinels"]) < 2 or int(fields[b"num-slaves"]) < replicas:
                    return False
            return True

        # A failover needs a majority of sentinels that know each other and the replicas.
        await _wait_for("the sentinels to know each other and the replicas", sentinels_know_all)
        return group
    except BaseException:
        group.cleanup()
        raise


@pytest.fixture
def groups() -> Iterator[list[ShardGroup]]:
    made: list[ShardGroup] = []
    yield made
    for g in made:
        g.cleanup()


def start_shard_loop(database_url: str, address: str, log: Any) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "SHARDQ_REDIS_URL": address,
        "SHARDQ_DATABASE_URL": database_url,
        "SHARDQ_KEY_PREFIX": PREFIX,
        "SHARDQ_SHARD_REPLICAS_TO_ACK": "1",
        "SHARDQ_METRICS_PORT": "0",
        "SHARDQ_REAP_INTERVAL_MS": "200",
        "SHARDQ_LEADER_TTL_MS": "2000",
        "SHARDQ_LOG_LEVEL": "WARNING",
    }
    argv = [*parent_death_prefix(), sys.executable, "-m", "shardq.shard"]
    return subprocess.Popen(argv, env=env, stderr=log)


@contextlib.asynccontextmanager
async def sentinel_cluster(database_url: str, group: ShardGroup) -> AsyncIterator[Cluster]:
    """A coordinator whose shard map names ``group`` by its sentinels, waiting for replicas."""
    await asyncio.to_thread(upgrade, database_url)
    cs = CoordinatorSettings(
        listen="127.0.0.1:0",
        database_url=database_url,
        map_poll_interval_s=0.2,
        shard=ShardSettings(key_prefix=PREFIX, durability=DURABLE),
    )
    setup = Coordinator(cs)
    checks = ShardChecker("", cs.shard)
    await ShardMapStore(setup.engine, checks=checks).sync_shards([group.address])
    _, admin_token = await TokenStore(setup.engine).create("admin")
    await setup.engine.dispose()
    server, port, coord, health = await build_server(cs)
    await server.start()
    cluster = Cluster(
        group.redis_processes, database_url, cs, server, port, coord, health, admin_token
    )
    try:
        await wait_until_listening(coord, 1)
        yield cluster
    finally:
        await cluster.close_clients()
        await cluster.server.stop(0)
        await cluster.coordinator.stop()


class Load:
    """Submits from a few tenants, each retried with its request_id through the failover;
    what was acknowledged is kept for the reconciliation."""

    def __init__(self, cluster: Cluster, tenants: list[str]) -> None:
        self.cluster = cluster
        self.tenants = tenants
        self.accepted = Accepted()
        self.failed: list[BaseException] = []
        #: request_ids acknowledged once the sentinels had promoted a replica.
        self.after_failover: list[str] = []
        self.failed_over = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        # Long enough to ride out the failover; the same request_id on every retry.
        retry = RetryPolicy(deadline_s=45.0, cap_s=0.5)
        for tenant in self.tenants:
            client = await self.cluster.client(tenant, retry=retry)
            self._tasks.append(asyncio.create_task(self._submit(tenant, client)))

    async def _submit(self, tenant: str, client: Any) -> None:
        n = 0
        while not self._stop.is_set():
            rid = f"{tenant}-{n}"
            try:
                sub = await client.submit("test.work", {"n": n, "ms": 5}, request_id=rid)
            except ShardqError as exc:
                self.failed.append(exc)
            else:
                self.accepted.add(tenant, rid, sub.job_id)
                if self.failed_over.is_set():
                    self.after_failover.append(rid)
            n += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


@pytest.fixture
def procs_log(tmp_path: Path) -> Iterator[IO[bytes]]:
    with (tmp_path / "procs.log").open("wb") as f:
        yield f


async def test_a_primary_killed_under_load_fails_over_and_loses_no_acknowledged_submit(
    database_url: str, groups: list[ShardGroup], procs_log: IO[bytes], tmp_path: Path
) -> None:
    group = await start_group("shard-0", replicas=2)
    groups.append(group)
    workers: list[WorkerProcess] = []
    loop_proc = None
    runs_file = str(tmp_path / "runs")
    try:
        async with sentinel_cluster(database_url, group) as cluster:
            loop_proc = start_shard_loop(database_url, group.address, procs_log)
            for name in ("w-a", "w-b"):
                workers.append(
                    start_worker(
                        cluster,
                        name,
                        log=procs_log,
                        concurrency=8,
                        shard_replicas_to_ack=1,
                        test_executions_file=runs_file,
                    )
                )
            for w in workers:
                await wait_until_serving(w, timeout_s=90)
            load = Load(cluster, [f"t{n}" for n in range(4)])
            await load.start()
            await _wait_for("300 accepted submits", lambda: _ready(len(load.accepted) >= 300))
            old_port = group.primary.port
            group.primary.kill()  # kill -9: its host is gone
            killed_at = time.monotonic()
            await _wait_for(
                "the sentinels to promote a replica",
                lambda: _ready_async(group.master_port(), lambda p: p != old_port),
            )
            load.failed_over.set()
            await _wait_for(
                "200 submits acknowledged after the failover",
                lambda: _ready(len(load.after_failover) >= 200),
            )
            await load.stop()
            result = await settle(
                load.accepted,
                database_url=database_url,
                shards=[group.address],
                key_prefix=PREFIX,
                faults_ended_at=time.monotonic(),
                deadline_s=90.0,
                # The handler's runs (attempt numbers unknown: 0), for the re-executions.
                runs=lambda: {
                    (rid.split("-")[0], rid): [0] * n for rid, n in executions_in(runs_file).items()
                },
            )
            print(
                f"\nfailover: {len(load.accepted)} acknowledged, {len(load.failed)} submits gave "
                f"up, {len(load.after_failover)} acknowledged after the promotion (the load "
                f"ran {time.monotonic() - killed_at:.1f} s after the kill)\n{result.render()}"
            )
            assert not load.failed, f"submits that gave up: {load.failed[:3]}"
            assert not result.lost, result.render()
            assert not result.stuck, result.render()
            assert result.ok, result.render()
            await _rejoins_as_replica(group, old_port)
    finally:
        for w in workers:
            w.stop()
        if loop_proc is not None:
            loop_proc.terminate()
            await asyncio.to_thread(loop_proc.wait, 30)


async def _rejoins_as_replica(group: ShardGroup, old_port: int) -> None:
    """The dead primary comes back (its pod restarted on its volume): the sentinels make it a
    replica of the new primary, and the identity marker still says shard 0 there."""
    group.primary.stop()
    group.primary.start()  # the same port and data directory
    await _wait_for(
        "the old primary to rejoin as a replica",
        lambda: _ready_async(_info(old_port), lambda i: i["role"] == "slave"),
    )
    async with _client(await group.master_port()) as r:
        assert await r.get(f"{PREFIX}:identity") == b"0"


async def _ready(value: bool) -> bool:
    return value


async def _ready_async(aw: Any, test: Any) -> bool:
    return bool(test(await aw))


async def test_a_stale_primary_never_acknowledges_a_write_and_loses_it_on_rejoining(
    groups: list[ShardGroup],
) -> None:
    """A primary cut off (frozen) while the sentinels promote its replica, then back: it
    refuses writes (``min-replicas-to-write``), and even one that accepts a write (that
    setting lost) never acknowledges it (WAIT finds no replica), and the write is gone once
    the sentinels make it a replica of the new primary."""
    group = await start_group("shard-s", replicas=1)
    groups.append(group)
    address = group.address
    settings = ShardSettings(key_prefix=PREFIX, durability=DURABLE)
    shard = ShardClient(redis_for(address, ""), settings)
    old = ShardClient(redis_for(f"127.0.0.1:{group.primary.port}", ""), settings)
    try:
        first = await shard.submit(NewJob("acme", "h", b"{}", request_id="before"))
        assert group.primary.proc is not None
        group.primary.proc.send_signal(signal.SIGSTOP)  # cut off: alive, unreachable
        try:
            old_port = group.primary.port
            await _wait_for(
                "the sentinels to promote the replica",
                lambda: _ready_async(group.master_port(), lambda p: p != old_port),
            )
        finally:
            group.primary.proc.send_signal(signal.SIGCONT)
        # Through the sentinels, submits go to the new primary: it has the job from before.
        new = await shard.get_job("acme", first.job_id)
        assert new.request_id == "before"

        # The stale primary, straight at its address: its replica is gone, it takes no write.
        with pytest.raises(NotReplicated, match="NOREPLICAS"):
            await old.submit(NewJob("acme", "h", b"{}", request_id="stale-1"))
        # Without that fence it would take the write, but nobody is told it was done.
        async with _client(old_port) as r:
            if (await r.info("replication"))["role"] == "master":
                await r.config_set("min-replicas-to-write", 0)
                with pytest.raises(NotReplicated) as caught:
                    await old.submit(NewJob("acme", "h", b"{}", request_id="stale-2"))
                assert isinstance(caught.value, Unavailable)
                # It was written there, and only there.
                (entry,) = await old.dedupe_entries("acme", ["stale-2"])
                assert entry is not None

        await _wait_for(
            "the old primary to rejoin as a replica",
            lambda: _ready_async(_info(old_port), lambda i: i["role"] == "slave"),
        )
        # Its unacknowledged write is gone everywhere: the new primary never had it, and the
        # old one dropped it when it resynchronised.
        await _wait_for(
            "the old primary in sync",
            lambda: _ready_async(_info(old_port), lambda i: i["master_link_status"] == "up"),
        )
        for client in (old, shard):
            assert await client.dedupe_entries("acme", ["stale-1", "stale-2"]) == [None, None]
        assert (await shard.get_job("acme", first.job_id)).request_id == "before"
    finally:
        await shard.redis.aclose()
        await old.redis.aclose()


async def test_a_shard_address_is_refused_with_too_few_replicas_for_the_durability_asked(
    groups: list[ShardGroup],
) -> None:
    group = await start_group("shard-c", replicas=1)
    groups.append(group)
    ok = ShardChecker("", ShardSettings(key_prefix=PREFIX, durability=DURABLE))
    report = await ok.inspect(group.address)
    assert report.keys == 0
    two = ShardSettings(key_prefix=PREFIX, durability=replace(DURABLE, replicas=2))
    with pytest.raises(AddressRefused, match=r"1 connected replica.*asks for 2"):
        await ShardChecker("", two).inspect(group.address)
    unknown = group.address.rsplit("/", 1)[0] + "/no-such-master"
    with pytest.raises(AddressRefused, match="no sentinel answers with a primary"):
        await ok.inspect(unknown)


async def test_shards_init_checks_and_marks_the_primary_a_sentinel_group_names(
    database_url: str, groups: list[ShardGroup], capsys: pytest.CaptureFixture[str]
) -> None:
    """``shardq shards init`` with a ``sentinel://`` address, as an operator runs it."""
    group = await start_group("shard-cli", replicas=1)
    groups.append(group)
    await asyncio.to_thread(upgrade, database_url)
    base = ["shards", "init", "--address", group.address, "--database-url", database_url]
    base += ["--key-prefix", PREFIX]

    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, [*base, "--shard-replicas-to-ack", "2"])
    err = capsys.readouterr().err
    assert code != 0
    assert "has 1 connected replica(s) where --shard-replicas-to-ack asks for 2" in err, err

    assert await asyncio.to_thread(cli.main, [*base, "--shard-replicas-to-ack", "1"]) == 0
    # The marker is written through the primary the sentinels name, and replicated.
    for proc in group.redis_processes:
        async with _client(proc.port) as r:
            marker = await _wait_for(
                f"the identity marker on port {proc.port}",
                lambda r=r: r.get(f"{PREFIX}:identity"),
                timeout_s=30,
            )
            assert marker == b"0"


async def _promoted(group: ShardGroup, old_port: int) -> int:
    """The new primary's port, once the sentinels have promoted a replica."""

    async def new_port() -> int:
        port = await group.master_port()
        return port if port != old_port else 0

    found: int = await _wait_for("the sentinels to promote a replica", new_port)
    return found


async def test_a_claim_lost_in_a_failover_never_leaves_two_workers_with_one_token(
    groups: list[ShardGroup],
) -> None:
    """The fencing counter a claim raises must be on a replica before the worker gets the
    job: else the primary hands a job to one worker, dies before its replicas heard of it,
    and the promoted replica hands the same (job, token) to another, and both pass the fence.
    Here the replicas are cut off (a proxy between them and the primary) when a worker
    claims: the claim is refused (UNAVAILABLE) and the job handed back, uncounted; after the
    failover another worker claims it, and no two workers ever held the same token."""
    proxy = CuttableProxy("127.0.0.1", 0)
    group = await start_group("shard-fence", replicas=2, fence=False, through=proxy)
    groups.append(group)
    settings = ShardSettings(key_prefix=PREFIX, durability=DURABLE)
    shard = ShardClient(redis_for(group.address, ""), settings)
    try:
        a = await shard.submit(NewJob("acme", "h", b"{}", request_id="a"))  # replicated
        b = await shard.submit(NewJob("acme", "h", b"{}", request_id="b"))
        (first,) = await shard.claim("w-1", 1, 600_000)  # replicated: it stands
        assert first.job_id == a.job_id
        held = [first]
        proxy.cut()  # the replicas hear nothing more from the primary
        with pytest.raises(NotReplicated, match="acknowledged by 0 of 1"):
            held += await shard.claim("w-2", 1, 600_000)
        # Handed back on the primary: ready again, its attempt not counted.
        back = await shard.get_job("acme", b.job_id)
        assert (back.state, back.attempts) == (JobState.READY, 0)

        old_port = group.primary.port
        group.primary.kill()
        await _promoted(group, old_port)

        async def claim_again() -> Any:
            return await shard.claim("w-3", 1, 600_000)

        (second,) = await _wait_for("a claim on the new primary", claim_again)
        assert second.job_id == b.job_id
        assert (second.job_id, second.fence) not in {(j.job_id, j.fence) for j in held}
        assert second.fence > first.fence
        # Each lease is its holder's alone on the new primary.
        leases = [Lease(j.job_id, j.fence) for j in (first, second)]
        assert await shard.heartbeat(leases, 600_000) == [ItemCode.OK, ItemCode.OK]
    finally:
        await shard.redis.aclose()
        await proxy.stop()


async def test_the_identity_marker_is_waited_for_like_any_write(
    groups: list[ShardGroup],
) -> None:
    """``shards init`` (ShardChecker.mark) with --shard-replicas-to-ack: a marker that no
    replica confirms is not taken as written."""
    group = await start_group("shard-mark", replicas=1, fence=False)
    groups.append(group)
    checker = ShardChecker("", ShardSettings(key_prefix=PREFIX, durability=DURABLE))
    replica = group.replicas[0].proc
    assert replica is not None
    replica.send_signal(signal.SIGSTOP)  # still connected, confirms nothing
    try:
        with pytest.raises(NotReplicated, match="acknowledged by 0 of 1"):
            await checker.mark(group.address, 0)
    finally:
        replica.send_signal(signal.SIGCONT)
    await checker.mark(group.address, 0)  # confirmed once the replica answers


async def _calls(port: int, command: str) -> int:
    stats = await _info(port, "commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_after_a_failover_the_pool_sends_nothing_to_an_old_primary_left_up(
    groups: list[ShardGroup],
) -> None:
    """A switch that leaves the old primary up and reachable by shardq but not demoted by the
    sentinels (here its CLIENT command is renamed, so their MULTI ... REPLICAOF ... CLIENT
    KILL fails on it and it stays a primary with its clients open, as one cut off from them
    would): once the pool has asked the sentinels again, no command of its reaches the old
    primary, neither on its idle connections nor on one that was in use at the switch."""
    group = await start_group(
        "shard-pool", replicas=1, fence=False, primary_args=["--rename-command", "CLIENT", ""]
    )
    groups.append(group)
    client = redis_for(group.address, "")
    pool: Any = client.connection_pool
    try:
        await client.set("k", "v")
        await asyncio.gather(*(client.get("k") for _ in range(8)))  # a few idle connections
        held = await pool.get_connection()  # and one in use across the switch
        old_port = group.primary.port
        assert pool.master_address == ("127.0.0.1", old_port)

        async def failover() -> bool:
            async with _client(group.sentinels[0].port) as s:
                return bool(await s.execute_command("SENTINEL", "FAILOVER", group.name))

        await _wait_for("a failover to start", failover)
        new_port = await _promoted(group, old_port)

        async def every_sentinel_names_it() -> bool:
            ports = [await group.master_port(i) for i in range(len(group.sentinels))]
            return ports == [new_port] * len(ports)

        await _wait_for("every sentinel to name the new primary", every_sentinel_names_it)
        # The pool has not been used since before the switch; past the interval, its next
        # handout asks the sentinels.
        await asyncio.sleep(MASTER_CHECK_INTERVAL_S)
        await pool.release(held)
        assert (await _info(old_port))["role"] == "master"  # still up, still answering
        before = await _calls(old_port, "get")
        assert await asyncio.gather(*(client.get("k") for _ in range(20))) == [b"v"] * 20
        assert await _calls(old_port, "get") == before
        assert pool.master_address == ("127.0.0.1", new_port)
        assert await _calls(new_port, "get") >= 20
    finally:
        await client.aclose()


async def test_with_every_sentinel_down_the_pool_keeps_the_primary_it_knows(
    groups: list[ShardGroup],
) -> None:
    """The pool's regular question to the sentinels is not a dependency of every command: with
    no sentinel answering (none can fail the shard over either), commands go on reaching the
    primary it knows over the connections it holds."""
    group = await start_group("shard-nosentinel", replicas=1, fence=False)
    groups.append(group)
    client = redis_for(group.address, "")
    try:
        await client.set("k", "v")
        for sentinel in group.sentinels:
            sentinel.kill()
        await asyncio.sleep(MASTER_CHECK_INTERVAL_S)  # the next call asks, and nobody answers
        assert await client.get("k") == b"v"
        await client.set("k", "w")
        assert await client.get("k") == b"w"
    finally:
        await client.aclose()
