"""Live workers across coordinator replicas, in Postgres.

Each replica refreshes ``last_seen`` of the workers whose assignment streams it holds, every
``refresh_s``, and reads the whole live set (seen within ``ttl_s``). All replicas compute the
same assignment (``coordinator.assignment.assign``) from the same set, so shards are spread
over every live worker, not only over one replica's. A closed stream deletes its row at once;
a replica that dies stops refreshing and its workers drop out after ``ttl_s``.

Its database calls go through ``db.Uncancellable``: a stream is cancelled whenever its worker
goes away, which is exactly when its row is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.store.db import Uncancellable, workers

log = logging.getLogger("shardq.coordinator")


class WorkerRegistry:
    def __init__(self, engine: AsyncEngine, ttl_s: float = 10.0, refresh_s: float = 1.0) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.refresh_s = refresh_s
        #: Workers with a stream on this replica: worker_id -> (hostname, concurrency).
        self.local: dict[str, tuple[str, int]] = {}
        #: Every live worker of the cluster, as last read.
        self.live: frozenset[str] = frozenset()
        self._listeners: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._calls = Uncancellable()

    def on_change(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="shardq-worker-registry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._calls.drain()

    async def join(self, worker_id: str, hostname: str, concurrency: int) -> None:
        self.local[worker_id] = (hostname, concurrency)
        await self._calls.run(self.refresh())

    async def leave(self, worker_id: str) -> None:
        self.local.pop(worker_id, None)
        await self._calls.run(self._delete(worker_id))

    async def _delete(self, worker_id: str) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(sa.delete(workers).where(workers.c.worker_id == worker_id))
        except sa.exc.DBAPIError as exc:
            log.warning("could not remove worker %s: %s", worker_id, exc)
        await self.refresh()

    async def refresh(self) -> None:
        """Mark local workers seen and re-read the live set; tell listeners when it changed."""
        live = set(self.local)
        try:
            async with self.engine.begin() as conn:
                if self.local:
                    stmt = insert(workers).values(
                        [
                            {"worker_id": w, "hostname": h, "concurrency": c,
                             "last_seen": sa.func.now()}
                            for w, (h, c) in self.local.items()
                        ]
                    )  # fmt: skip
                    await conn.execute(
                        stmt.on_conflict_do_update(
                            index_elements=[workers.c.worker_id],
                            set_={"last_seen": sa.func.now()},
                        )
                    )
                cutoff = sa.func.now() - sa.text(f"interval '{float(self.ttl_s)} seconds'")
                rows = await conn.execute(
                    sa.select(workers.c.worker_id).where(workers.c.last_seen > cutoff)
                )
                live |= {r[0] for r in rows}
        except sa.exc.DBAPIError as exc:
            # Without the database, assign over what this replica knows; never drop work.
            log.warning("worker registry unavailable: %s", exc)
            live |= self.live
        if frozenset(live) != self.live:
            self.live = frozenset(live)
            for fn in self._listeners:
                fn()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self._calls.run(self.refresh())
