"""Load per tenant: rates sampled from the counters in Redis, the load hash, the gauges."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from shardq.common.errors import InvalidArgument
from shardq.common.ops_http import OpsServer
from shardq.coordinator.convert import tenant_stats_pb
from shardq.shard import FakeClock, NewJob, ShardClient, ShardSettings
from shardq.shard.__main__ import parse_args
from shardq.shard.load import LoadSampler, TenantGauges, next_sample
from shardq.shard.loop import LoopMetrics, LoopSettings, ShardLoop
from shardq.shard.models import Failure, Lease, TenantLimits, TenantLoad

SETTINGS = ShardSettings(key_prefix="sq")
SECOND = 1_000


def jobs(tenant: str, n: int, start: int = 0, **kw: Any) -> list[NewJob]:
    return [
        NewJob(tenant=tenant, handler="h", payload=b"{}", request_id=f"r{i}", **kw)
        for i in range(start, start + n)
    ]


def untyped(redis: Redis) -> Any:
    """redis-py annotates replies as ``Awaitable[T] | T``; the asyncio client's are awaitable."""
    return redis


async def stored(redis: Redis, tenant: str) -> dict[str, Any]:
    raw = await untyped(redis).hget("sq:load", tenant)
    assert raw is not None
    value: dict[str, Any] = json.loads(raw)
    return value


async def work(shard: ShardClient, n: int, succeed: int) -> None:
    """Claim ``n`` jobs: ack ``succeed`` of them, fail the rest (they will be retried)."""
    claimed = await shard.claim("w1", n, lease_ms=60_000)
    assert len(claimed) == n
    await shard.ack([Lease(c.job_id, c.fence) for c in claimed[:succeed]])
    await shard.fail([Failure(c.job_id, c.fence, c.attempt, "boom") for c in claimed[succeed:]])


async def test_rates_are_the_counter_increases_over_the_sampled_interval(
    redis: Redis, shard: ShardClient, clock: FakeClock
) -> None:
    # beta's jobs wait, so that every job claimed below is one of acme's.
    await shard.enqueue(jobs("acme", 30) + jobs("beta", 4, delay_ms=600_000))
    sampler = LoadSampler(shard)
    first = await sampler.sample()
    # The first sample of a tenant has nothing to compare with: no rates yet.
    assert first["acme"] == TenantLoad(
        "acme", ready=30, submitted_total=30, at_ms=clock.now_ms(), pending_bytes=60
    )
    assert await stored(redis, "acme") == {"at_ms": clock.now_ms(), "submitted": 30,
                                           "succeeded": 0, "failed": 0}  # fmt: skip

    clock.advance(10 * SECOND)
    await shard.enqueue(jobs("acme", 20, start=30))
    await shard.enqueue(jobs("acme", 5, start=100, delay_ms=60_000))
    await work(shard, 10, succeed=8)
    loads = await sampler.sample()

    acme = loads["acme"]
    assert (acme.submit_per_s, acme.complete_per_s, acme.fail_per_s) == (2.5, 0.8, 0.2)
    # Two failed attempts went back to scheduled for their retry, beside the 5 delayed jobs.
    assert (acme.ready, acme.active, acme.scheduled, acme.dead) == (40, 0, 7, 0)
    assert (acme.submitted_total, acme.completed_total, acme.failed_total) == (55, 8, 2)
    assert acme.at_ms == clock.now_ms()
    assert (loads["beta"].submit_per_s, loads["beta"].scheduled) == (0.0, 4)
    assert await stored(redis, "acme") == {
        "submit_per_s": 2.5, "complete_per_s": 0.8, "fail_per_s": 0.2,
        "at_ms": clock.now_ms(), "submitted": 55, "succeeded": 8, "failed": 2,
    }  # fmt: skip
    # The client reads the same figures back (gauges read now, rates as last sampled).
    assert await shard.tenant_loads() == loads
    assert await shard.tenant_load("acme") == acme


async def test_a_new_leader_goes_on_from_the_last_stored_sample(
    redis: Redis, shard: ShardClient, clock: FakeClock
) -> None:
    await shard.enqueue(jobs("acme", 10))
    await LoadSampler(shard).sample()
    clock.advance(4 * SECOND)
    await shard.enqueue(jobs("acme", 6, start=10))
    # Another process, another sampler: nothing in memory, everything from Redis.
    other = ShardClient(redis, SETTINGS, clock)
    loads = await LoadSampler(other).sample()
    assert loads["acme"].submit_per_s == 1.5


async def test_a_sample_sooner_than_the_minimum_gap_keeps_the_last_one(
    redis: Redis, shard: ShardClient, clock: FakeClock
) -> None:
    sampler = LoadSampler(shard, min_gap_ms=5 * SECOND)
    await shard.enqueue(jobs("acme", 10))
    await sampler.sample()
    clock.advance(10 * SECOND)
    await shard.enqueue(jobs("acme", 10, start=10))
    await sampler.sample()
    before = await stored(redis, "acme")
    clock.advance(SECOND)
    await shard.enqueue(jobs("acme", 50, start=20))
    loads = await sampler.sample()
    assert await stored(redis, "acme") == before
    # The gauges are read now; the rate stays that of the last full interval.
    assert (loads["acme"].submit_per_s, loads["acme"].ready) == (1.0, 70)


async def test_a_counter_that_went_down_is_taken_as_restarted_from_zero(
    redis: Redis, shard: ShardClient, clock: FakeClock
) -> None:
    sampler = LoadSampler(shard)
    await shard.enqueue(jobs("acme", 10))
    await sampler.sample()
    await redis.delete("sq:counts:acme")
    clock.advance(2 * SECOND)
    await shard.enqueue(jobs("acme", 4, start=10))
    assert (await sampler.sample())["acme"].submit_per_s == 2.0


def test_a_clock_that_stepped_back_starts_the_tenant_afresh() -> None:
    previous = {"at_ms": 5_000, "submitted": 1, "succeeded": 0, "failed": 0}
    counts = {"submitted": 9}
    assert next_sample(counts, previous, now_ms=4_000) == {
        "at_ms": 4_000, "submitted": 9, "succeeded": 0, "failed": 0,
    }  # fmt: skip


async def test_tenants_gone_from_the_shard_leave_the_load_hash(
    redis: Redis, shard: ShardClient, clock: FakeClock
) -> None:
    await shard.enqueue(jobs("acme", 1) + jobs("beta", 1))
    sampler = LoadSampler(shard)
    await sampler.sample()
    assert sorted(await untyped(redis).hkeys("sq:load")) == [b"acme", b"beta"]
    await untyped(redis).srem("sq:tenants", "beta")  # as a finished move off this shard leaves it
    clock.advance(SECOND)
    assert set(await sampler.sample()) == {"acme"}
    assert await untyped(redis).hkeys("sq:load") == [b"acme"]


async def test_tenants_are_read_and_written_in_chunks(redis: Redis, clock: FakeClock) -> None:
    shard = ShardClient(redis, ShardSettings(key_prefix="sq", max_batch=3), clock)
    names = [f"t{i}" for i in range(8)]
    for i, name in enumerate(names):
        await shard.enqueue(jobs(name, i + 1))
    sampler = LoadSampler(shard)
    await sampler.sample()
    clock.advance(SECOND)
    for i, name in enumerate(names):
        await shard.enqueue(jobs(name, i, start=100))
    loads = await sampler.sample()
    assert {t: (x.ready, x.submit_per_s) for t, x in loads.items()} == {
        name: (2 * i + 1, float(i)) for i, name in enumerate(names)
    }
    assert await untyped(redis).hlen("sq:load") == 8


async def test_the_load_of_an_unknown_tenant_is_all_zeros(shard: ShardClient) -> None:
    assert await shard.tenant_load("nobody") == TenantLoad("nobody")
    with pytest.raises(InvalidArgument):
        await shard.tenant_load("no/such")


# --- gauges on /metrics ------------------------------------------------------------------


def scrape(port: int) -> dict[str, dict[str, float]]:
    """Metric name -> tenant -> value, of every sample with a tenant label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "tenant" in s.labels:
                assert s.labels["shard"] == "7"
                out.setdefault(s.name, {})[s.labels["tenant"]] = s.value
    return out


async def test_only_the_busiest_tenants_get_gauges_and_those_that_drop_out_lose_them(
    shard: ShardClient, clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    gauges = TenantGauges(registry, "7")
    ops = OpsServer(registry, lambda: (True, {}), host="127.0.0.1")
    port = await ops.start(0)
    try:
        sampler = LoadSampler(shard, gauges, top_n=2)
        for name, n in (("a", 1), ("b", 2), ("c", 3)):
            await shard.enqueue(jobs(name, n))
        await sampler.sample()
        # No rates yet: the most pending jobs rank first.
        got = await asyncio.to_thread(scrape, port)
        assert got["shardq_tenant_ready"] == {"c": 3.0, "b": 2.0}
        assert set(got["shardq_tenant_submit_rate"]) == {"b", "c"}

        clock.advance(SECOND)
        await shard.enqueue(jobs("a", 5, start=10))  # a is now the one submitting
        await sampler.sample()
        got = await asyncio.to_thread(scrape, port)
        assert got["shardq_tenant_submit_rate"] == {"a": 5.0, "c": 0.0}
        for name in ("scheduled", "ready", "active", "dead", "complete_rate", "fail_rate"):
            assert set(got[f"shardq_tenant_{name}"]) == {"a", "c"}, name
        assert registry.get_sample_value("shardq_shard_tenants", {"shard": "7"}) == 3
    finally:
        await ops.stop()


async def test_pauses_parked_tenants_and_pending_bytes_show_on_the_gauges_until_lifted(
    shard: ShardClient,
) -> None:
    registry = CollectorRegistry()
    sampler = LoadSampler(shard, TenantGauges(registry, "3"), top_n=5)
    await shard.enqueue(jobs("a", 2) + jobs("b", 3) + jobs("c", 1, queue="mail"))
    await shard.set_limits("b", TenantLimits(max_active=1))
    assert len(await shard.claim("w1", 5, lease_ms=60_000)) >= 2  # b reaches its cap: parked
    await shard.pause(tenant="a")
    await shard.pause(tenant="c", queue="mail")
    await shard.pause(queue="reports")
    await sampler.sample()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"shard": "3", **labels})

    assert value("shardq_shard_paused_tenants") == 1
    assert value("shardq_shard_paused_tenant_queues") == 1
    assert value("shardq_shard_parked_tenants") == 1
    assert value("shardq_queue_paused", queue="reports") == 1
    assert value("shardq_tenant_pending_bytes", tenant="b") == 6  # three payloads of b"{}"
    assert value("shardq_tenant_unrunnable", tenant="a") == 0

    await shard.resume(tenant="a")
    await shard.resume(tenant="c", queue="mail")
    await shard.resume(queue="reports")
    await sampler.sample()
    assert value("shardq_shard_paused_tenants") == 0
    assert value("shardq_shard_paused_tenant_queues") == 0
    assert value("shardq_queue_paused", queue="reports") is None


async def test_the_running_leader_samples_and_exposes_tenant_gauges(redis: Redis) -> None:
    # On the wall clock, like the loop: the fake one's "600 s from now" is long past.
    await ShardClient(redis, SETTINGS).enqueue(jobs("acme", 3) + jobs("beta", 1, delay_ms=600_000))
    registry = CollectorRegistry()
    # The loop runs on the wall clock; only the gauges, not the rates, are asserted here.
    loop = ShardLoop(
        ShardClient(redis, SETTINGS),
        LoopSettings(leader_ttl_ms=1_000, max_idle_ms=60_000, load_interval_s=0.05),
        LoopMetrics(registry, "7"),
    )
    ops = OpsServer(registry, lambda: (True, {}), host="127.0.0.1")
    port = await ops.start(0)
    task = asyncio.create_task(loop.run())
    try:
        deadline = time.monotonic() + 20
        while (got := await asyncio.to_thread(scrape, port)).get("shardq_tenant_ready") != {
            "acme": 3.0,
            "beta": 0.0,
        }:
            assert time.monotonic() < deadline, got
            await asyncio.sleep(0.05)
        assert got["shardq_tenant_scheduled"] == {"acme": 0.0, "beta": 1.0}
        assert await untyped(redis).hlen("sq:load") == 2
    finally:
        loop.stop()
        await asyncio.wait_for(task, 10)
        # A loop that no longer leads shows no tenant figures (they would go stale).
        assert await asyncio.to_thread(scrape, port) == {}
        await ops.stop()


async def test_a_failing_sample_does_not_stop_the_leader(redis: Redis) -> None:
    await untyped(redis).sadd("sq:tenants", "acme")
    await untyped(redis).hset("sq:counts:acme", "submitted", "not a number")
    loop = ShardLoop(
        ShardClient(redis, SETTINGS),
        LoopSettings(leader_ttl_ms=1_000, max_idle_ms=60_000, load_interval_s=0.01),
    )
    task = asyncio.create_task(loop.run())
    try:
        # The loop still promotes after samples failed: the job below becomes ready.
        (res,) = await ShardClient(redis, SETTINGS).enqueue(jobs("beta", 1, delay_ms=200))
        deadline = time.monotonic() + 20
        while (await ShardClient(redis, SETTINGS).get_job("beta", res.job_id)).state != "ready":
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.02)
        assert loop.role == "leader"
    finally:
        loop.stop()
        await asyncio.wait_for(task, 10)


def test_the_load_settings_are_flags_with_environment_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    defaults = parse_args([])
    assert (defaults.load_interval_s, defaults.load_top_tenants) == (10.0, 50)
    monkeypatch.setenv("SHARDQ_LOAD_INTERVAL_S", "2.5")
    monkeypatch.setenv("SHARDQ_LOAD_TOP_TENANTS", "7")
    args = parse_args([])
    assert (args.load_interval_s, args.load_top_tenants) == (2.5, 7)
    assert parse_args(["--load-interval-s", "0"]).load_interval_s == 0.0


# --- the tenant stats of the API ---------------------------------------------------------


def test_tenant_stats_fill_every_field_of_the_message() -> None:
    load = TenantLoad(
        "acme", scheduled=1, ready=2, active=3, dead=4, submitted_total=5, completed_total=6,
        failed_total=7, submit_per_s=8.5, complete_per_s=9.5, fail_per_s=10.5, at_ms=11,
        pending_bytes=13, unrunnable_total=14,
    )  # fmt: skip
    limits = TenantLimits(weight=2, max_active=3)
    pb = tenant_stats_pb(
        "acme", 12, load, limits=limits, paused=True, paused_queues=["reports", "emails"]
    )
    unset = [
        f.name
        for f in pb.DESCRIPTOR.fields
        if not (pb.HasField(f.name) if f.message_type else getattr(pb, f.name))
    ]
    assert not unset, f"TenantStats fields tenant_stats_pb leaves unset: {unset}"
    assert (pb.tenant_id, pb.shard_id, pb.scheduled, pb.dead) == ("acme", 12, 1, 4)
    assert (pb.submitted_total, pb.completed_total, pb.failed_total) == (5, 6, 7)
    assert (pb.submitted_per_s, pb.completed_per_s, pb.failed_per_s) == (8.5, 9.5, 10.5)
    assert pb.rates_sampled_at_unix_ms == 11
    assert (pb.pending_bytes, pb.unrunnable_total) == (13, 14)
    assert (pb.limits.weight, pb.limits.max_active, pb.paused) == (2, 3, True)
    assert list(pb.paused_queues) == ["emails", "reports"]


async def test_tenant_stats_carry_the_sampled_rates(shard: ShardClient, clock: FakeClock) -> None:
    sampler = LoadSampler(shard)
    await shard.enqueue(jobs("acme", 2))
    await sampler.sample()
    clock.advance(2 * SECOND)
    await shard.enqueue(jobs("acme", 6, start=2))
    await sampler.sample()
    pb = tenant_stats_pb("acme", 3, await shard.tenant_load("acme"))
    assert (pb.ready, pb.submitted_total, pb.submitted_per_s) == (8, 8, 3.0)
    assert pb.rates_sampled_at_unix_ms == clock.now_ms()
