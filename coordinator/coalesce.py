"""Concurrent submits for one shard share one Redis round trip.

The first submit that finds the shard idle starts a flush; submits that arrive while a flush
is in flight wait for the next one, which takes all of them at once (up to the batch limit).
Under load this batches naturally, and an idle shard adds no delay: no timer, no linger.
"""

from __future__ import annotations

import asyncio

from shardq.shard.client import ShardClient
from shardq.shard.records import EnqueueResult, PreparedJob


class Coalescer:
    def __init__(self, shard: ShardClient, max_batch: int = 500) -> None:
        self.shard = shard
        self.max_batch = max_batch
        self._queue: list[tuple[PreparedJob, int, asyncio.Future[EnqueueResult]]] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, job: PreparedJob, map_version: int = 0) -> asyncio.Future[EnqueueResult]:
        """Queue one job prepared by ``ShardClient.prepare``, routed with shard-map
        ``map_version``; the future holds its result."""
        fut: asyncio.Future[EnqueueResult] = asyncio.get_running_loop().create_future()
        self._queue.append((job, map_version, fut))
        if self._task is None or self._task.done():
            # A task of its own, so a caller that gives up cannot cancel the others' flush.
            self._task = asyncio.create_task(self._flush())
        return fut

    async def _flush(self) -> None:
        while self._queue:
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            # The oldest map of the batch: if the shard refuses it, each caller re-routes.
            version = min(v for _, v, _ in batch)
            try:
                results = await self.shard.enqueue_prepared([j for j, _, _ in batch], None, version)
            except Exception as exc:
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
            else:
                for (_, _, fut), res in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(res)

    async def close(self) -> None:
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
