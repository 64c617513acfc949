"""Each placement command owns its change: it runs (or waits for) the moves it recorded, never
another command's, and says so when others are pending. Through the real ``shardq`` command
(a process of its own) against a real cluster: redis-server shards, Postgres, coordinators."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from shardq.client import AsyncClient, job_spec
from shardq.coordinator.moverd import MoverLease, lease_holder
from shardq.coordinator.shardmap import MoverLeaseLost, ShardMapStore
from tests.integration.test_mover_failover import (
    load_map,
    run_shardq,
    token_for,
    two_coordinators,
)
from tests.support.cli import Run
from tests.support.cluster import Cluster, running_cluster


def tenants_on(cluster: Cluster, shard_id: int, n: int) -> list[str]:
    smap = cluster.coordinator.shard_map
    return [t for t in (f"c{i}" for i in range(10_000)) if smap.shard_for(t) == shard_id][:n]


async def shardq(database_url: str, *words: str) -> Run:
    done = await run_shardq(database_url, *words)
    return Run(done.returncode, done.stdout, done.stderr)


async def submit(cluster: Cluster, tenant: str, n: int = 20) -> None:
    c = await cluster.client(tenant)
    await c.submit_many([job_spec("test.work", {"n": i}) for i in range(n)])


async def test_a_command_runs_its_own_move_and_names_the_others_pending(
    database_url: str,
) -> None:
    # No coordinator runs moves here (the in-process coordinator's default): the command
    # runs its own move itself, under the mover lease.
    async with running_cluster(database_url) as cluster:
        mine, stranded = tenants_on(cluster, 0, 2)
        for t in (mine, stranded):
            await submit(cluster, t)
        # A move whose mover died (recorded, never run): not this command's to finish.
        left = await shardq(database_url, "tenants", "move", stranded, "1", "--no-move")
        assert left.code == 0, left.err
        assert await lease_holder(database_url) is None

        run = await shardq(database_url, "tenants", "move", mine, "1")
        assert run.code == 0, run.err
        assert f"1 other move in progress, not this command's ({stranded})" in run.out, run.out
        assert "moving 1 tenant here" in run.out, run.out
        assert f"{stranded}:" not in run.out  # no progress line of the other move
        moves = (await load_map(database_url)).moves
        assert sorted(moves) == [stranded]  # the other move still shows, unfinished
        assert moves[stranded].change_version != 0

        # `moves run` stays the manual tool: it runs what it is given, here the rest.
        rest = await shardq(database_url, "moves", "run", stranded)
        assert rest.code == 0, rest.err
        assert (await load_map(database_url)).moves == {}


async def test_concurrent_tenant_moves_each_wait_for_their_own_while_the_cluster_runs_them(
    database_url: str,
) -> None:
    async with two_coordinators(database_url) as (_, coords):
        smap = await load_map(database_url)
        tenants = [t for t in (f"m{i}" for i in range(10_000)) if smap.shard_for(t) == 0][:3]
        for t in tenants:
            async with AsyncClient(coords[0].target, await token_for(database_url, t)) as c:
                await c.submit_many([job_spec("test.work", {"n": i}) for i in range(20)])
        holder = None
        while holder is None:  # one of the two coordinators takes the lease
            holder = await lease_holder(database_url)
            await asyncio.sleep(0.1)
        runs = await asyncio.gather(
            *(shardq(database_url, "tenants", "move", t, "1", "--wait") for t in tenants)
        )
        for tenant, run in zip(tenants, runs, strict=True):
            assert run.code == 0, run.err
            others = [t for t in tenants if t != tenant]
            assert run.out.rstrip().endswith("1 move done"), run.out
            # It waited for its own move only: no line counts the others as its own.
            assert "/2 moves" not in run.out and "/3 moves" not in run.out, run.out
            for line in run.out.splitlines():
                if any(o in line for o in others):
                    assert "not this command's" in line, run.out
        assert (await load_map(database_url)).moves == {}
        assert all(c.proc.poll() is None for c in coords)


async def test_a_mover_that_lost_the_lease_cannot_end_a_move(database_url: str) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant)
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err
        move = (await load_map(database_url)).moves[tenant]
        first, second = MoverLease(database_url, "first"), MoverLease(database_url, "second")
        try:
            assert await first.try_acquire()
            assert not await second.try_acquire()  # one holder at a time
            stale_pid, stale_token = first.pid, first.token
            await first.release()
            assert await second.try_acquire()
            assert second.token > stale_token  # the fencing token only grows
            holder = await lease_holder(database_url)
            assert holder is not None and (holder.name, holder.pid) == ("second", second.pid)
            store = ShardMapStore(cluster.coordinator.engine)
            with pytest.raises(MoverLeaseLost):
                await store.finish_move(move, stale_pid)
            assert tenant in (await load_map(database_url)).moves  # the mark stays
            assert await store.finish_move(move, second.pid)  # the holder may
        finally:
            await first.release()
            await second.release()


TENANTS = 1_000


@pytest.mark.timeout(900)
async def test_shards_add_with_a_thousand_tenants_bumps_the_map_version_a_few_times(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running_cluster(database_url) as cluster:
        tenants = [f"k{i}" for i in range(TENANTS)]
        for t in tenants:
            async with AsyncClient(cluster.target, cluster.admin_token, tenant_id=t) as c:
                await c.submit("test.work", {})
        before = (await load_map(database_url)).version
        third = cluster.add_shard_process()
        added = await shardq(database_url, "shards", "add", f"127.0.0.1:{third.port}")
        assert added.code == 0, added.err
        after = await load_map(database_url)
        moved = sum(after.shard_for(t) == 2 for t in tenants)
        assert after.moves == {} and moved > TENANTS // 5, (after.moves, moved)
        bumps = after.version - before
        with capsys.disabled():
            print(f"\nshards add moved {moved} of {TENANTS} tenants: {bumps} map versions")
        # One for the change, then one per batch of finished moves (before: one per move).
        assert bumps <= 1 + moved // 10, (bumps, moved)


async def test_moved_tenants_keep_their_load_and_their_pins_so_rebalance_proposes_nothing(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        busy, calm = tenants_on(cluster, 0, 2)
        source, target = (cluster.coordinator.pool.get(i)[0] for i in (0, 1))
        r: Any = source.redis
        for tenant, rate in ((busy, 40.0), (calm, 20.0)):
            await submit(cluster, tenant)
            # What the source's shard loop sampled last: ``rate`` jobs a second.
            sample = {"submit_per_s": rate, "complete_per_s": rate, "fail_per_s": 0.5,
                      "at_ms": int(time.time() * 1000), "submitted": 20, "succeeded": 0,
                      "failed": 0}  # fmt: skip
            await r.hset(source.keys.load(), tenant, json.dumps(sample))
            moved = await shardq(database_url, "tenants", "move", tenant, "1")
            assert moved.code == 0, moved.err
        assert (await load_map(database_url)).moves == {}
        load = await target.tenant_load(busy)
        assert (load.submit_per_s, load.complete_per_s, load.fail_per_s) == (40.0, 40.0, 0.5)
        assert load.submitted_total == 20

        # All the load is on shard 1 now, by the operator's pins: the plan keeps them...
        plan = await shardq(database_url, "rebalance", "--plan")
        assert plan.code == 0, plan.err
        assert "1      60.7      60.7" in plan.out, plan.out  # the moved load, counted at once
        assert "balanced: nothing to move" in plan.out, plan.out
        # ...unless told it may re-pin.
        repin = await shardq(database_url, "rebalance", "--plan", "--repin")
        assert f"pin tenant {busy} (load 40.3) shard 1 -> 0" in repin.out, repin.out
