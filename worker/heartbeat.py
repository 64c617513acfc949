"""Lease heartbeats on a thread of their own, so a handler that hogs the event loop (or the
GIL in long slices) cannot make this worker lose its leases. One call per shard extends every
in-flight lease; a lost or cancelled lease is reported back to the worker's loop.

A heartbeat works on a snapshot of the leases. The worker removes a lease here *before* it
sends the ack (fail, release) that ends it, so a STALE_LEASE for a lease no longer held when
the answer comes is that ack's doing, not a loss, and is not reported: the ack reached Redis
after the removal, the heartbeat after the ack, and the check after the heartbeat.

Progress rides on the same calls. A handler's report (``Context.progress``) only replaces the
job's pending value here (the last one wins); this thread sends pending values with the
regular heartbeat, or sooner in a heartbeat of their own, but at most once per
``progress_interval_ms``, so a handler reporting in a tight loop costs Redis nothing more. The
script stores a value only under the lease's current fencing token, like the extension itself.
Every progress write goes out from this one thread, in order, so an older value cannot
overtake a newer one; the worker asks this thread to :meth:`flush` a finished job's last value
before it sends the ack that ends the lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence

from redis.exceptions import RedisError

from shardq.shard.client import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.models import Lease
from shardq.shard.records import JobProgress

log = logging.getLogger("shardq.worker")

#: (shard_id, job_id, code) for a lease that is STALE_LEASE or CANCEL_REQUESTED.
LostFn = Callable[[int, str, ItemCode], None]
ClientFactory = Callable[[str], ShardClient]
#: A job of a shard: (shard_id, job_id).
JobKey = tuple[int, str]


class Heartbeater:
    def __init__(
        self,
        lease_ms: int,
        make_client: ClientFactory,
        on_lost: LostFn,
        progress_interval_ms: int = 1_000,
    ) -> None:
        self.lease_ms = lease_ms
        self.progress_interval_ms = progress_interval_ms
        self._make_client = make_client
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._leases: dict[int, dict[str, Lease]] = {}
        self._addresses: dict[int, str] = {}
        #: Progress reported and not sent yet, by shard and job ID: the last report wins.
        self._progress: dict[int, dict[str, JobProgress]] = {}
        #: Jobs whose pending progress must go out now, and who waits for it.
        self._flushes: list[tuple[Collection[JobKey], concurrent.futures.Future[None]]] = []
        self._stop = threading.Event()
        #: Set when there is something to send before the next regular heartbeat.
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._main, name="shardq-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(10)
        with self._lock:
            flushes, self._flushes = self._flushes, []
        for _, fut in flushes:
            fut.set_result(None)

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
            self._progress.get(shard_id, {}).pop(job_id, None)

    def holds(self, shard_id: int, lease: Lease) -> bool:
        """Whether ``lease`` (this job, this fence) is still one to keep alive."""
        with self._lock:
            return self._leases.get(shard_id, {}).get(lease.job_id) == lease

    def report(self, shard_id: int, lease: Lease, progress: JobProgress) -> bool:
        """Keep ``progress`` to send for the job of ``lease`` (any thread); False when this
        worker no longer holds the lease (nothing will be sent)."""
        with self._lock:
            if self._leases.get(shard_id, {}).get(lease.job_id) != lease:
                return False
            self._progress.setdefault(shard_id, {})[lease.job_id] = progress
        self._wake.set()
        return True

    def flush(self, jobs: Collection[JobKey]) -> concurrent.futures.Future[None] | None:
        """Send the pending progress of ``jobs`` now; the future is done once it is stored (or
        its call failed). None when none of them has any (nothing to wait for)."""
        with self._lock:
            if self._stop.is_set() or not any(
                jid in self._progress.get(sid, {}) for sid, jid in jobs
            ):
                return None
            fut: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._flushes.append((jobs, fut))
        self._wake.set()
        return fut

    def _snapshot(
        self, only: Collection[JobKey] | None = None
    ) -> list[tuple[int, str, list[Lease], dict[str, JobProgress]]]:
        """Per shard: the leases to send (all, or those of the jobs ``only`` names) and the
        pending progress among them, taken (a failed call puts it back: :meth:`_restore`)."""
        out = []
        with self._lock:
            for sid, held in self._leases.items():
                leases = [ls for jid, ls in held.items() if only is None or (sid, jid) in only]
                if not leases:
                    continue
                pending = self._progress.get(sid, {})
                progress = {
                    ls.job_id: pending.pop(ls.job_id) for ls in leases if ls.job_id in pending
                }
                out.append((sid, self._addresses[sid], leases, progress))
        return out

    def _restore(self, shard_id: int, progress: dict[str, JobProgress]) -> None:
        with self._lock:
            pending = self._progress.setdefault(shard_id, {})
            for jid, p in progress.items():
                if jid in self._leases.get(shard_id, {}):
                    pending.setdefault(jid, p)  # a newer report since wins

    def _has_progress(self) -> bool:
        with self._lock:
            return any(self._progress.values())

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        clients: dict[str, ShardClient] = {}
        interval = self.lease_ms / 3000
        pace = self.progress_interval_ms / 1000
        next_beat = time.monotonic() + interval
        last_progress = float("-inf")
        try:
            while not self._stop.is_set():
                # Cleared before the state is read: a report arriving from here on wakes the
                # wait below at once.
                self._wake.clear()
                with self._lock:
                    flushes, self._flushes = self._flushes, []
                now = time.monotonic()
                if now >= next_beat:
                    await self._beat(clients, self._snapshot())
                    next_beat, last_progress = now + interval, now
                elif flushes:
                    wanted = {key for jobs, _ in flushes for key in jobs}
                    await self._beat(clients, self._snapshot(wanted))
                elif self._has_progress() and now >= last_progress + pace:
                    with self._lock:
                        pending = {(s, j) for s, ps in self._progress.items() for j in ps}
                    await self._beat(clients, self._snapshot(pending))
                    last_progress = now
                for _, fut in flushes:
                    fut.set_result(None)
                timeout = next_beat - time.monotonic()
                if self._has_progress():
                    timeout = min(timeout, last_progress + pace - time.monotonic())
                self._wake.wait(max(0.0, timeout))
        finally:
            for c in clients.values():
                await c.redis.aclose()

    async def _beat(
        self,
        clients: dict[str, ShardClient],
        snapshot: list[tuple[int, str, list[Lease], dict[str, JobProgress]]],
    ) -> None:
        for shard_id, address, leases, progress in snapshot:
            client = clients.get(address)
            if client is None:
                client = clients[address] = self._make_client(address)
            try:
                if progress:
                    codes = await client.heartbeat(leases, self.lease_ms, progress)
                else:
                    codes = await client.heartbeat(leases, self.lease_ms)
            except RedisError as exc:
                log.warning("heartbeat to shard %s failed: %s", shard_id, exc)
                self._restore(shard_id, progress)
                continue
            for lease, code in zip(leases, codes, strict=True):
                # Removed since the snapshot: settled by the worker, whose own call
                # says whether the lease was still its own (see the module's doc).
                if code is not ItemCode.OK and self.holds(shard_id, lease):
                    self._on_lost(shard_id, lease.job_id, code)
