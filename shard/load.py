"""Load per tenant: the shard loop's sampler of submit and completion rates, and its gauges.

The Lua scripts already keep, per tenant, gauges (``scheduled``, ``ready``, ``active``,
``dead``) and counters that only grow (``submitted``, ``succeeded``, ``failed``) in the
tenant's counts hash (:meth:`shard.keys.Keys.counts`). Rates need no more work on the hot
path: every ``load_interval_s`` the leading shard loop reads every tenant's counters
(pipelined, in chunks) and divides each counter's increase by the time since the tenant's
previous sample. Three rates, one per counter:

- ``submit_per_s``: jobs accepted (a deduplicated submit is not a new job);
- ``complete_per_s``: jobs that succeeded. Jobs that end dead are not in it: ``dead`` is a
  gauge (a requeue takes jobs back out), so no counter says how many died;
- ``fail_per_s``: attempts that failed or whose lease expired, retried or not. Workers spend
  ``complete_per_s + fail_per_s`` attempts per second on the tenant (an active job cancelled
  and acked is in neither: no counter records it).

Each sample, with the counters it was computed from, is stored in the :meth:`Keys.load` hash,
so the loop that leads next computes its first rates from the last leader's sample instead of
starting over. A tenant's first sample has no rates (they read as 0). A counter that went down
(its counts hash was removed and started again) is taken to have restarted from 0, as
Prometheus does with a counter reset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge

from shardq.shard.models import PauseSummary, TenantLoad

if TYPE_CHECKING:
    from shardq.shard.client import ShardClient

#: Counter of the counts hash -> the rate computed from it.
RATES = {"submitted": "submit_per_s", "succeeded": "complete_per_s", "failed": "fail_per_s"}


def next_sample(
    counts: dict[str, int], previous: dict[str, Any], now_ms: int, min_gap_ms: int = 0
) -> dict[str, Any] | None:
    """A tenant's new entry of the load hash, or None to keep ``previous``.

    None when ``previous`` is less than ``min_gap_ms`` old: a rate over a sliver of time
    (right after a leader change, or two loops leading for a moment) is mostly noise.
    """
    sample: dict[str, Any] = {}
    prev_at = previous.get("at_ms")
    gap = now_ms - prev_at if isinstance(prev_at, int) and prev_at > 0 else -1
    if 0 <= gap < max(1, min_gap_ms):
        return None
    if gap > 0:
        for counter, rate in RATES.items():
            before, now = previous.get(counter), counts.get(counter, 0)
            if not isinstance(before, int):
                continue
            increase = now - before if now >= before else now
            sample[rate] = round(increase * 1000 / gap, 3)
    # A gap < 0 (no sample yet, or a clock stepped back) starts afresh: counters, no rates.
    sample["at_ms"] = now_ms
    sample.update((counter, counts.get(counter, 0)) for counter in RATES)
    return sample


def _compact(sample: dict[str, Any]) -> str:
    return json.dumps(sample, separators=(",", ":"))


class TenantGauges:
    """Per-tenant gauges on the loop's /metrics, for the ``top_n`` busiest tenants only.

    One label set per tenant would grow without bound with the tenants of a shard; only the
    busiest are shown (by rate, then by pending jobs), and tenants that drop out of the top
    lose their label sets so Prometheus stops seeing them.
    """

    def __init__(self, registry: CollectorRegistry, shard_id: str) -> None:
        self.shard_id = shard_id

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["shard", "tenant"], registry=registry)

        self.scheduled = gauge("shardq_tenant_scheduled", "Jobs of the tenant now scheduled")
        self.ready = gauge("shardq_tenant_ready", "Jobs of the tenant now ready")
        self.active = gauge("shardq_tenant_active", "Jobs of the tenant now active")
        self.dead = gauge("shardq_tenant_dead", "Jobs of the tenant now dead")
        self.submit_rate = gauge(
            "shardq_tenant_submit_rate", "Jobs accepted per second, last sampled interval"
        )
        self.complete_rate = gauge(
            "shardq_tenant_complete_rate", "Jobs succeeded per second, last sampled interval"
        )
        self.fail_rate = gauge(
            "shardq_tenant_fail_rate", "Failed or expired attempts per second, last interval"
        )
        self.pending_bytes = gauge(
            "shardq_tenant_pending_bytes", "Payload bytes of the tenant's pending jobs"
        )
        self.unrunnable = gauge(
            "shardq_tenant_unrunnable",
            "Jobs handed back by a worker without their handler, ever (rising: no live "
            "worker of the queue can run them)",
        )

        def shard_gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["shard"], registry=registry)

        self.paused_tenants = shard_gauge(
            "shardq_shard_paused_tenants", "Tenants paused whole"
        ).labels(shard=shard_id)
        self.paused_tenant_queues = shard_gauge(
            "shardq_shard_paused_tenant_queues", "Single tenants' queues paused"
        ).labels(shard=shard_id)
        self.parked = shard_gauge(
            "shardq_shard_parked_tenants", "Tenants held back at their max_active cap"
        ).labels(shard=shard_id)
        # One series per queue paused for every tenant; resumed queues lose theirs.
        self.paused_queue = Gauge(
            "shardq_queue_paused", "1 while the queue is paused for every tenant of the shard",
            ["shard", "queue"], registry=registry,
        )  # fmt: skip
        self._paused_queues: set[str] = set()
        self.tenants = Gauge(
            "shardq_shard_tenants", "Tenants on the shard (all, not only those shown)",
            ["shard"], registry=registry,
        ).labels(shard=shard_id)  # fmt: skip
        self._all = (
            self.scheduled, self.ready, self.active, self.dead,
            self.submit_rate, self.complete_rate, self.fail_rate,
            self.pending_bytes, self.unrunnable,
        )  # fmt: skip
        self._shown: set[str] = set()

    def show(self, loads: Iterable[TenantLoad], top_n: int) -> list[str]:
        """Set the gauges of the ``top_n`` busiest tenants, drop the others; returns those shown."""
        every = list(loads)
        self.tenants.set(len(every))
        top = sorted(every, key=busiest_first)[: max(0, top_n)]
        for load in top:
            labels = {"shard": self.shard_id, "tenant": load.tenant}
            self.scheduled.labels(**labels).set(load.scheduled)
            self.ready.labels(**labels).set(load.ready)
            self.active.labels(**labels).set(load.active)
            self.dead.labels(**labels).set(load.dead)
            self.submit_rate.labels(**labels).set(load.submit_per_s)
            self.complete_rate.labels(**labels).set(load.complete_per_s)
            self.fail_rate.labels(**labels).set(load.fail_per_s)
            self.pending_bytes.labels(**labels).set(load.pending_bytes)
            self.unrunnable.labels(**labels).set(load.unrunnable_total)
        shown = {load.tenant for load in top}
        for tenant in self._shown - shown:
            self._remove(tenant)
        self._shown = shown
        return [load.tenant for load in top]

    def show_pauses(self, summary: PauseSummary) -> None:
        """Set the shard's pause and park gauges."""
        self.paused_tenants.set(summary.tenants)
        self.paused_tenant_queues.set(summary.tenant_queues)
        self.parked.set(summary.parked)
        for queue in self._paused_queues - set(summary.queues):
            self.paused_queue.remove(self.shard_id, queue)
        for queue in summary.queues:
            self.paused_queue.labels(shard=self.shard_id, queue=queue).set(1)
        self._paused_queues = set(summary.queues)

    def clear(self) -> None:
        """Drop every tenant's gauges (a loop that stops leading no longer samples)."""
        for tenant in self._shown:
            self._remove(tenant)
        self._shown = set()
        self.tenants.set(0)
        self.show_pauses(PauseSummary(0, [], 0, 0))

    def _remove(self, tenant: str) -> None:
        for g in self._all:
            g.remove(self.shard_id, tenant)


def busiest_first(load: TenantLoad) -> tuple[float, int, str]:
    """Sort key: most attempts and submits per second, then most jobs pending, then by name."""
    rate = load.submit_per_s + load.complete_per_s + load.fail_per_s
    return (-rate, -load.pending, load.tenant)


class LoadSampler:
    """Samples every tenant of one shard; the leading shard loop calls :meth:`sample`."""

    def __init__(
        self,
        shard: ShardClient,
        gauges: TenantGauges | None = None,
        top_n: int = 50,
        min_gap_ms: int = 0,
    ) -> None:
        self.shard = shard
        self.gauges = gauges
        self.top_n = top_n
        self.min_gap_ms = min_gap_ms
        # redis-py's annotations of replies are loose; the client works in bytes throughout.
        self._r: Any = shard.redis

    async def sample(self) -> dict[str, TenantLoad]:
        """Take one sample of every tenant, store it, refresh the gauges; returns the loads."""
        now = self.shard.clock.now_ms()
        key = self.shard.keys.load()
        loads: dict[str, TenantLoad] = {}
        writes: dict[str, str] = {}
        for tenant, counts, previous in await self.shard.load_rows():
            sample = next_sample(counts, previous, now, self.min_gap_ms)
            if sample is not None:
                writes[tenant] = _compact(sample)
            loads[tenant] = TenantLoad.of(tenant, counts, sample or previous)
        step = self.shard.settings.max_batch
        items = list(writes.items())
        pipe = self._r.pipeline(transaction=False)
        for i in range(0, len(items), step):
            pipe.hset(key, mapping=dict(items[i : i + step]))
        # Entries of tenants the shard no longer has (moved away) would otherwise stay forever.
        stale = {f.decode() for f in await self._r.hkeys(key)} - loads.keys()
        gone = sorted(stale)
        for i in range(0, len(gone), step):
            pipe.hdel(key, *gone[i : i + step])
        await pipe.execute()
        if self.gauges is not None:
            self.gauges.show(loads.values(), self.top_n)
            self.gauges.show_pauses(await self.shard.pause_summary())
        return loads
