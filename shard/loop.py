"""The shard loop (``shardq-shard``): one active per shard, by a leader lease in its Redis.

The leader promotes due jobs, fires recurring schedules, reaps expired leases, samples
every tenant's load (:mod:`shard.load`) and, given the results database, writes the rows of
jobs that ended without a worker and reconciles Redis with the rows (:mod:`shard.rows`).
When it starts leading it also converts what a shard written by an earlier shardq still holds
in the previous key layout (``upgrade_layout.lua``: ready lists without queues, rings per
priority, the weights hash), alongside the rest; ``promote.lua`` itself moves the shard-wide
delayed ZSET of the layout before ``due`` as it goes. It
sleeps until the next due job enters its promote-ahead window (but for a quarter of that
window after each promote) or the next cron tick, and wakes at once when an earlier job or
tick is scheduled (``enqueue``/``fail``/``schedule_upsert`` push a token on
``promoter_wake``). A standby retries the lease
every third of its TTL, so it takes over within ~1.3 TTL of the leader dying. Promotion is
idempotent, so two leaders for a moment (a paused process whose lease ran out) do no harm.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.exceptions import RedisError

from shardq.common.errors import NotFound
from shardq.common.redis import log_redis_error
from shardq.shard import cron
from shardq.shard.client import ShardClient
from shardq.shard.load import LoadSampler, TenantGauges
from shardq.shard.models import DueTick, NewJob
from shardq.shard.precheck import Prechecker
from shardq.shard.rows import TerminalRows

log = logging.getLogger("shardq.shard")


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LoopSettings:
    #: Leader lease length, in ms; renewed every third of it (``SHARDQ_LEADER_TTL_MS``).
    leader_ttl_ms: int = 5_000
    #: How often expired leases are looked for, in ms.
    reap_interval_ms: int = 1_000
    #: Longest the promoter sleeps with nothing due, in ms (a safety net, not a poll).
    max_idle_ms: int = 5_000
    #: Jobs due within this many ms are promoted already (``SHARDQ_PROMOTE_AHEAD_MS``):
    #: their worker claims them before their run-at and starts them on it, so neither the
    #: promoter's wake-up nor the claim makes them late. The promoter comes back for the next
    #: due job no sooner than a quarter of this after its last promote: each job is promoted
    #: 3/4 of it ahead or more, and a stream of jobs due a ms apart costs a promote per 5 ms,
    #: not one per job (a busy loop of three round trips each, a quarter of a core at 1,000
    #: due/s on the 2-core bench machine).
    promote_ahead_ms: int = 20
    #: Pause after a Redis error before trying again, in ms.
    retry_delay_ms: int = 500
    #: How often the leader samples every tenant's load, in s; 0 turns sampling off.
    load_interval_s: float = 10.0
    #: Tenants with per-tenant gauges on /metrics: the busiest this many (bounds the labels).
    load_top_tenants: int = 50
    instance_id: str = field(default_factory=default_instance_id)


class LoopMetrics:
    def __init__(self, registry: CollectorRegistry, shard_id: str) -> None:
        labels = {"shard": shard_id}
        self.leader = Gauge(
            "shardq_shard_leader", "1 while this loop holds the leader lease", ["shard"],
            registry=registry,
        ).labels(**labels)  # fmt: skip
        self.promoted = Counter(
            "shardq_promoted_jobs", "Jobs moved from scheduled to ready", ["shard"],
            registry=registry,
        ).labels(**labels)  # fmt: skip
        self.reaped = Counter(
            "shardq_reaped_leases", "Expired leases taken back", ["shard", "to"],
            registry=registry,
        )  # fmt: skip
        self.cron_fired = Counter(
            "shardq_cron_fired", "Recurring schedule occurrences enqueued", ["shard"],
            registry=registry,
        ).labels(**labels)  # fmt: skip
        self.tenants = TenantGauges(registry, shard_id)
        self.shard_id = shard_id


class LeadershipLost(Exception):
    pass


class ShardLoop:
    """Runs until :meth:`stop`; ``role`` is ``leader``, ``standby`` or ``disconnected``."""

    def __init__(
        self,
        shard: ShardClient,
        settings: LoopSettings,
        metrics: LoopMetrics | None = None,
        rows: TerminalRows | None = None,
        precheck: Prechecker | None = None,
    ) -> None:
        self.shard = shard
        #: None: no results database; ended jobs wait on the outbox (shardq-shard warns).
        self.rows = rows
        #: None: no results database; workers look every job up themselves.
        self.precheck = precheck
        self.settings = settings
        self.metrics = metrics or LoopMetrics(CollectorRegistry(), "0")
        self.role = "standby"
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self.sampler = LoadSampler(
            shard,
            self.metrics.tenants,
            top_n=settings.load_top_tenants,
            # Half an interval: a loop that takes over just after the last sample keeps the
            # old leader's rates instead of computing them over a sliver of time.
            min_gap_ms=int(settings.load_interval_s * 500),
        )

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        s = self.settings
        try:
            while not self._stopping.is_set():
                try:
                    if await self.shard.acquire_leader(s.instance_id, s.leader_ttl_ms):
                        await self._lead()
                    else:
                        self.role = "standby"
                        await self._pause(s.leader_ttl_ms / 3000)
                except RedisError as exc:
                    self.role = "disconnected"
                    log_redis_error(log, "shard redis", "a call", exc)
                    await self._pause(s.retry_delay_ms / 1000)
        finally:
            self.metrics.leader.set(0)
            with contextlib.suppress(RedisError):
                await self.shard.release_leader(s.instance_id)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _lead(self) -> None:
        self.role = "leader"
        self.metrics.leader.set(1)
        log.info("leader of shard %s as %s", self.metrics.shard_id, self.settings.instance_id)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._keep_lease())
                group.create_task(self._upgrade_layout())
                group.create_task(self._promote_forever())
                group.create_task(self._listen_for_wake())
                group.create_task(self._reap_forever())
                if self.settings.load_interval_s > 0:
                    group.create_task(self._sample_load_forever())
                if self.rows is not None:
                    group.create_task(self.rows.run())
                if self.precheck is not None:
                    group.create_task(self.precheck.run())
        except* LeadershipLost:
            if self._stopping.is_set():  # a clean stop: run() releases the lease itself
                log.info("stopping; giving up the leader lease")
            else:
                log.warning("leader lease lost; standing by")
        finally:
            self.metrics.leader.set(0)
            # Only the leader samples: a standby showing its last figures would show stale ones.
            self.metrics.tenants.clear()
            self.role = "standby"

    async def _keep_lease(self) -> None:
        s = self.settings
        last_ok = asyncio.get_running_loop().time()
        while not self._stopping.is_set():
            await self._pause(s.leader_ttl_ms / 3000)
            if self._stopping.is_set():
                break
            try:
                if not await self.shard.acquire_leader(s.instance_id, s.leader_ttl_ms):
                    raise LeadershipLost()
                last_ok = asyncio.get_running_loop().time()
            except RedisError as exc:
                # Once the lease may have run out, another loop may lead: stop acting.
                if asyncio.get_running_loop().time() - last_ok > s.leader_ttl_ms / 1000:
                    raise LeadershipLost() from exc
        raise LeadershipLost()  # stopping: unwind the other tasks

    async def _upgrade_layout(self) -> None:
        """Convert the previous key layout's leftovers once, in capped steps (a no-op on a
        shard written by this version); retried after a Redis error."""
        while True:
            try:
                moved = await self.shard.upgrade_layout()
            except RedisError as exc:
                log.warning("layout upgrade failed: %s", exc)
                await asyncio.sleep(self.settings.retry_delay_ms / 1000)
                continue
            if moved:
                log.info("moved %d ready jobs of the previous key layout to queue default", moved)
            return

    async def _listen_for_wake(self) -> None:
        while True:
            try:
                # Under the client's 10 s socket timeout (common/redis.py): a longer BLPOP
                # timed out every time, and a wake pushed while it reconnected was late.
                if await self.shard.wait_for_promoter_wake(timeout_s=5):
                    self._wake.set()
            except RedisError:
                await asyncio.sleep(self.settings.retry_delay_ms / 1000)

    async def _promote_forever(self) -> None:
        s = self.settings
        ahead = max(0, s.promote_ahead_ms)
        step = ahead // 4
        next_tick: int | None = None
        cron_read_at: int | None = None  # None: read the cron ZSET at the next turn
        while True:
            woken = self._wake.is_set()
            self._wake.clear()
            try:
                promoted, next_due = await self.shard.promote(ahead_ms=ahead)
                self.metrics.promoted.inc(promoted)
                # The cron ZSET is read again when a tick is due, when woken (a schedule with
                # the earliest tick pushes a wake-up: schedule_upsert.lua, move_in.lua) and at
                # least every max_idle_ms; not at every promote: two round trips each, which
                # a stream of due jobs would otherwise pay every few ms.
                now = self.shard.clock.now_ms()
                if (
                    woken
                    or cron_read_at is None
                    or now - cron_read_at >= s.max_idle_ms
                    or (next_tick is not None and now >= next_tick)
                ):
                    next_tick = await self._fire_cron()
                    cron_read_at = now
            except RedisError as exc:
                log.warning("promote failed: %s", exc)
                cron_read_at = None  # a wake-up taken this turn may not have been served
                await asyncio.sleep(s.retry_delay_ms / 1000)
                continue
            now = self.shard.clock.now_ms()
            if next_due is not None:
                next_due = max(next_due - ahead, now + step)
            wake_at = min(t for t in (next_due, next_tick, now + s.max_idle_ms) if t is not None)
            if wake_at > now:
                # A timeout scope, not wait_for: wait_for wraps the wait in a task of its own,
                # at every turn of a loop that a stream of due jobs turns every few ms.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout((wake_at - now) / 1000):
                        await self._wake.wait()

    async def _fire_cron(self) -> int | None:
        """Enqueue every due occurrence once; returns the next tick (unix ms) or None."""
        while ticks := await self.shard.due_ticks():
            for tick in ticks:
                await self._fire(tick)
        return await self.shard.next_cron_tick_ms()

    async def _fire(self, tick: DueTick) -> None:
        spec = await self.shard.get_schedule(tick.tenant, tick.schedule_id)
        now = self.shard.clock.now_ms()
        if spec is not None:
            # Enqueue first, then advance: a crash in between re-enqueues under the same
            # request_id, which dedupe turns into the same job. Missed ticks fire once.
            await self.shard.enqueue(
                [
                    NewJob(
                        tenant=tick.tenant,
                        handler=spec.handler,
                        payload=spec.payload,
                        request_id=cron.tick_request_id(tick.schedule_id, tick.tick_ms),
                        priority=spec.priority,
                        run_at_ms=min(tick.tick_ms, now),
                        max_attempts=spec.max_attempts,
                        timeout_ms=spec.timeout_ms,
                    )
                ]
            )
            self.metrics.cron_fired.inc()
            nxt = cron.next_tick_ms(spec.cron, spec.time_zone, max(now, tick.tick_ms))
            await self.shard.advance_schedule(tick, nxt)
        else:
            # Deleted between listing and reading: drop any stray cron entry.
            with contextlib.suppress(NotFound):
                await self.shard.delete_schedule(tick.tenant, tick.schedule_id)

    async def _reap_forever(self) -> None:
        while True:
            try:
                to_ready, to_dead = await self.shard.reap()
                if to_ready:
                    self.metrics.reaped.labels(shard=self.metrics.shard_id, to="ready").inc(
                        to_ready
                    )
                if to_dead:
                    self.metrics.reaped.labels(shard=self.metrics.shard_id, to="dead").inc(to_dead)
            except RedisError as exc:
                log.warning("reap failed: %s", exc)
            await asyncio.sleep(self.settings.reap_interval_ms / 1000)

    async def _sample_load_forever(self) -> None:
        while True:
            try:
                await self.sampler.sample()
            except RedisError as exc:
                log.warning("load sample failed: %s", exc)
            except Exception:
                # A figure for operators is not worth stopping promotion and reaping for (an
                # error here would end the leader's task group): log it, try next interval.
                log.exception("load sample failed")
            await asyncio.sleep(self.settings.load_interval_s)
