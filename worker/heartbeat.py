"""Lease heartbeats on a thread of their own, so a handler that hogs the event loop (or the
GIL in long slices) cannot make this worker lose its leases. One call per shard extends every
in-flight lease; a lost or cancelled lease is reported back to the worker's loop.

A heartbeat works on a snapshot of the leases. The worker removes a lease here *before* it
sends the ack (fail, release) that ends it, so a STALE_LEASE for a lease no longer held when
the answer comes is that ack's doing, not a loss, and is not reported: the ack reached Redis
after the removal, the heartbeat after the ack, and the check after the heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from shardq.shard.client import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.models import Lease

log = logging.getLogger("shardq.worker")

#: (shard_id, job_id, code) for a lease that is STALE_LEASE or CANCEL_REQUESTED.
LostFn = Callable[[int, str, ItemCode], None]
ClientFactory = Callable[[str], ShardClient]


class Heartbeater:
    def __init__(self, lease_ms: int, make_client: ClientFactory, on_lost: LostFn) -> None:
        self.lease_ms = lease_ms
        self._make_client = make_client
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._leases: dict[int, dict[str, Lease]] = {}
        self._addresses: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="shardq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def add(self, shard_id: int, address: str, lease: Lease) -> None:
        self.add_many(shard_id, address, [lease])

    def add_many(self, shard_id: int, address: str, leases: Sequence[Lease]) -> None:
        with self._lock:
            self._addresses[shard_id] = address
            held = self._leases.setdefault(shard_id, {})
            for lease in leases:
                held[lease.job_id] = lease

    def remove(self, shard_id: int, job_id: str) -> None:
        with self._lock:
            self._leases.get(shard_id, {}).pop(job_id, None)

    def holds(self, shard_id: int, lease: Lease) -> bool:
        """Whether ``lease`` (this job, this fence) is still one to keep alive."""
        with self._lock:
            return self._leases.get(shard_id, {}).get(lease.job_id) == lease

    def _snapshot(self) -> list[tuple[int, str, list[Lease]]]:
        with self._lock:
            return [
                (sid, self._addresses[sid], list(ls.values()))
                for sid, ls in self._leases.items()
                if ls
            ]

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        clients: dict[str, ShardClient] = {}
        interval = self.lease_ms / 3000
        try:
            while not self._stop.wait(interval):
                for shard_id, address, leases in self._snapshot():
                    client = clients.get(address)
                    if client is None:
                        client = clients[address] = self._make_client(address)
                    try:
                        codes = await client.heartbeat(leases, self.lease_ms)
                    except RedisError as exc:
                        log.warning("heartbeat to shard %s failed: %s", shard_id, exc)
                        continue
                    for lease, code in zip(leases, codes, strict=True):
                        # Removed since the snapshot: settled by the worker, whose own call
                        # says whether the lease was still its own (see the module's doc).
                        if code is not ItemCode.OK and self.holds(shard_id, lease):
                            self._on_lost(shard_id, lease.job_id, code)
        finally:
            for c in clients.values():
                await c.redis.aclose()
