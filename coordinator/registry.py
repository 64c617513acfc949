"""Live workers across coordinator replicas, in Postgres: who they are, which queues they serve
and which handlers they have.

Each replica refreshes ``last_seen`` of the workers whose assignment streams it holds, every
``refresh_s``, and reads the whole live set (seen within ``ttl_s``). All replicas compute the
same assignment (``coordinator.assignment.assign``) from the same set, so shards are dealt per
queue over every live worker of that queue, not only over one replica's. A closed stream
deletes its row at once; a replica that dies stops refreshing and its workers drop out after
``ttl_s``.

Its database calls go through ``db.Uncancellable``: a stream is cancelled whenever its worker
goes away, which is exactly when its row is written.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.shard.client import MAX_CLAIM_QUEUES
from shardq.shard.records import DEFAULT_QUEUE
from shardq.store.db import Uncancellable, workers

log = logging.getLogger("shardq.coordinator")

#: Most queues one worker may serve (what one claim names at most), and most handler names
#: it may report.
MAX_WORKER_QUEUES = MAX_CLAIM_QUEUES
MAX_WORKER_HANDLERS = 4_096


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker said of itself when it opened its assignment stream."""

    hostname: str = ""
    concurrency: int = 0
    #: Queues it claims from, sorted.
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)
    #: Names of its handlers.
    handlers: frozenset[str] = frozenset()


def worker_info(
    hostname: str, concurrency: int, queues: Iterable[str], handlers: Iterable[str]
) -> WorkerInfo:
    """A worker's introduction, checked: no queues means ``default``; each queue and handler
    name must be valid (InvalidArgument naming ``queues`` or ``handlers``)."""
    qs = sorted({validation.queue(q, "queues") for q in queues}) or [DEFAULT_QUEUE]
    hs = frozenset(validation.handler(h, "handlers") for h in handlers)
    if len(qs) > MAX_WORKER_QUEUES:
        raise InvalidArgument(f"{len(qs)} queues, at most {MAX_WORKER_QUEUES}", field="queues")
    if len(hs) > MAX_WORKER_HANDLERS:
        raise InvalidArgument(
            f"{len(hs)} handlers, at most {MAX_WORKER_HANDLERS}", field="handlers"
        )
    return WorkerInfo(hostname[:256], max(0, concurrency), tuple(qs), hs)


class WorkerRegistry:
    #: Check a worker's introduction (see :func:`worker_info`).
    worker_info = staticmethod(worker_info)

    def __init__(self, engine: AsyncEngine, ttl_s: float = 10.0, refresh_s: float = 1.0) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.refresh_s = refresh_s
        #: Workers with a stream on this replica.
        self.local: dict[str, WorkerInfo] = {}
        #: Every live worker of the cluster, as last read (this replica's always included).
        self.live: Mapping[str, WorkerInfo] = {}
        #: queue -> the handlers some live worker of that queue has.
        self._handlers_by_queue: dict[str, frozenset[str]] = {}
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

    async def join(self, worker_id: str, info: WorkerInfo) -> None:
        self.local[worker_id] = info
        await self._calls.run(self.refresh())

    async def leave(self, worker_id: str) -> None:
        self.local.pop(worker_id, None)
        await self._calls.run(self._delete(worker_id))

    def snapshot(self) -> dict[str, WorkerInfo]:
        """Every live worker and every worker with a stream on this replica."""
        return {**self.live, **self.local}

    def serves(self, queue: str, handler: str) -> bool:
        """Whether some live worker serving ``queue`` has ``handler`` (as last read)."""
        return handler in self._handlers_by_queue.get(queue, frozenset())

    async def _delete(self, worker_id: str) -> None:
        try:
            async with self.engine.begin() as conn:
                await conn.execute(sa.delete(workers).where(workers.c.worker_id == worker_id))
        except sa.exc.DBAPIError as exc:
            log.warning("could not remove worker %s: %s", worker_id, exc)
        await self.refresh()

    async def refresh(self) -> None:
        """Mark local workers seen and re-read the live set; tell listeners when it changed."""
        live = dict(self.local)
        try:
            async with self.engine.begin() as conn:
                if self.local:
                    await conn.execute(self._upsert_local())
                cutoff = sa.func.now() - sa.text(f"interval '{float(self.ttl_s)} seconds'")
                rows = await conn.execute(
                    sa.select(
                        workers.c.worker_id,
                        workers.c.hostname,
                        workers.c.concurrency,
                        workers.c.queues,
                        workers.c.handlers,
                    ).where(workers.c.last_seen > cutoff)
                )
                for w, hostname, concurrency, queues, handlers in rows:
                    if w not in live:
                        live[w] = WorkerInfo(
                            hostname,
                            concurrency,
                            tuple(sorted(queues)) or (DEFAULT_QUEUE,),
                            frozenset(handlers),
                        )
        except sa.exc.DBAPIError as exc:
            # Without the database, assign over what this replica knows; never drop work.
            log.warning("worker registry unavailable: %s", exc)
            live = {**self.live, **live}
        if live != self.live:
            self.live = live
            self._handlers_by_queue = _handlers_by_queue(live.values())
            for fn in self._listeners:
                fn()

    def _upsert_local(self) -> sa.Executable:
        stmt = insert(workers).values(
            [
                {
                    "worker_id": w,
                    "hostname": info.hostname,
                    "concurrency": info.concurrency,
                    "queues": list(info.queues),
                    "handlers": sorted(info.handlers),
                    "last_seen": sa.func.now(),
                }
                for w, info in self.local.items()
            ]
        )
        # A worker that reconnects may serve other queues or handlers now: take its latest.
        return stmt.on_conflict_do_update(
            index_elements=[workers.c.worker_id],
            set_={
                "hostname": stmt.excluded.hostname,
                "concurrency": stmt.excluded.concurrency,
                "queues": stmt.excluded.queues,
                "handlers": stmt.excluded.handlers,
                "last_seen": sa.func.now(),
            },
        )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self._calls.run(self.refresh())


def _handlers_by_queue(infos: Iterable[WorkerInfo]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for info in infos:
        for queue in info.queues:
            found[queue] |= info.handlers
    return {q: frozenset(hs) for q, hs in found.items()}
