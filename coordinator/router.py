"""Where a tenant's work goes: one tenant on one shard, or on two while it moves.

Outside a move, a tenant has one side: the shard its slot (or pin) maps to. While it moves
(``ShardMap.moves``, see :mod:`coordinator.mover`) it has two: the source, which the mover empties
copy-then-delete, and the target, where new work goes. :class:`TenantRouter` is the one place
that knows this: it sends submits to the target (routed again when a shard says the map moved on),
checks dedupe on the source too, reads a job on whichever side has it, pages listings over both
sides, retries a cancel while the job is being copied, sums a tenant's load over both, and gives
both sides the tenant's limits and pauses (a queue paused for every tenant goes to every shard).

The gRPC services (:mod:`coordinator.api`) authenticate, parse and convert; they call the router
for everything that depends on where a tenant is, and the router knows nothing of protobuf.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shardq.common.errors import (
    AlreadyExists,
    InvalidArgument,
    NotFound,
    ShardqError,
    Unavailable,
)
from shardq.common.redis import redis_for
from shardq.coordinator.coalesce import Coalescer
from shardq.coordinator.errors import SHARD_ADDRESS_ATTR, SHARD_ID_ATTR
from shardq.coordinator.limits import overlay
from shardq.coordinator.placement import ShardMap
from shardq.coordinator.shardmap import ShardMapFollower
from shardq.shard.client import ShardClient, Turn
from shardq.shard.codes import ItemCode
from shardq.shard.models import (
    NewJob,
    Schedule,
    ScheduleSpec,
    ShardSettings,
    TenantLimits,
    TenantLoad,
)
from shardq.shard.moving import ShardSide
from shardq.shard.records import EnqueueResult, JobRecord, JobState, PreparedJob

#: Times a submit is routed again after a shard refused the map it was routed with.
MAX_REROUTES = 5
#: Pause before asking again to cancel a job that its tenant's move is copying, in seconds.
CANCEL_RETRY_S = 0.05

#: Tenants whose limits and pauses a listing reads at once (each read takes a connection).
STATUS_CONCURRENCY = 32

T = TypeVar("T")


def _tag(exc: BaseException, shard_id: int, address: str) -> None:
    if getattr(exc, SHARD_ID_ATTR, None) is None:
        setattr(exc, SHARD_ID_ATTR, shard_id)
        setattr(exc, SHARD_ADDRESS_ATTR, address)


class _ShardPipeline(Pipeline):
    shard_id: int
    address: str

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return await super().execute(raise_on_error)
        except Exception as exc:
            _tag(exc, self.shard_id, self.address)
            raise


class ShardRedis(Redis):
    """A shard's Redis (opened by ``redis_for``) whose errors carry the shard's ID and address
    (``coordinator.errors.SHARD_ID_ATTR``): the client is told "shard 2 unreachable", the
    operator's log and CLI say where. The errors keep their type: nothing that catches them
    changes."""

    shard_id: int
    address: str

    @classmethod
    def open(cls, shard_id: int, address: str, password: str, username: str = "") -> ShardRedis:
        client = cls(connection_pool=redis_for(address, password, username).connection_pool)
        client.auto_close_connection_pool = True  # aclose() closes the pool: it is ours
        client.shard_id, client.address = shard_id, address
        return client

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        except Exception as exc:
            _tag(exc, self.shard_id, self.address)
            raise

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> Pipeline:
        pipe = _ShardPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.shard_id, pipe.address = self.shard_id, self.address
        return pipe


class ShardPool:
    """One ShardClient (and submit coalescer) per shard of the current map."""

    def __init__(self, redis_password: str, settings: ShardSettings) -> None:
        self.redis_password = redis_password
        self.settings = settings
        self._clients: dict[int, tuple[str, ShardClient, Coalescer]] = {}
        #: Closes of the clients a map change replaced, still under way: close() waits for
        #: them, or a coordinator stopped right after a change would leave their connections
        #: open on a closed event loop.
        self._closing: set[asyncio.Task[None]] = set()

    def update(self, smap: ShardMap) -> None:
        """Follow ``smap``: a client for each new shard, a new client for a shard whose address
        changed, and none for a shard that left the map (the old clients are closed)."""
        old: list[tuple[str, ShardClient, Coalescer]] = []
        for shard_id in self._clients.keys() - smap.shards.keys():
            old.append(self._clients.pop(shard_id))
        for shard_id, info in smap.shards.items():
            current = self._clients.get(shard_id)
            if current is None or current[0] != info.address:
                redis = ShardRedis.open(
                    shard_id, info.address, self.redis_password, self.settings.redis_username
                )
                client = ShardClient(redis, self.settings)
                self._clients[shard_id] = (info.address, client, Coalescer(client))
                if current is not None:
                    old.append(current)
        for _, client, coalescer in old:
            task = asyncio.get_running_loop().create_task(_close(client, coalescer))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def get(self, shard_id: int) -> tuple[ShardClient, Coalescer]:
        try:
            _, client, coalescer = self._clients[shard_id]
        except KeyError:
            raise Unavailable(f"shard {shard_id} is not in the shard map") from None
        return client, coalescer

    def all(self) -> dict[int, ShardClient]:
        return {sid: c for sid, (_, c, _) in self._clients.items()}

    async def close(self) -> None:
        await asyncio.gather(
            *self._closing, *(_close(c, co) for _, c, co in self._clients.values())
        )
        self._clients.clear()


async def _close(client: ShardClient, coalescer: Coalescer) -> None:
    await coalescer.close()
    await client.redis.aclose()


@dataclass(frozen=True, slots=True)
class Side:
    """One shard that may hold a tenant's jobs."""

    shard_id: int
    client: ShardClient
    coalescer: Coalescer


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job as read, and the shard it was read from."""

    shard_id: int
    record: JobRecord


class Submitted(NamedTuple):
    """One job of a submit: what was sent to the shard, its answer, and the shard (a
    NamedTuple, as the two it holds: one per submitted job)."""

    job: PreparedJob
    result: EnqueueResult
    shard_id: int


@dataclass(frozen=True, slots=True)
class TenantStatus:
    """What a tenant's shard enforces now: the limits its hash holds (0: unset, the caller's
    default applies) and its pauses."""

    limits: TenantLimits = dataclasses.field(default_factory=TenantLimits)
    #: The whole tenant is paused.
    paused: bool = False
    #: Queues paused for this tenant alone or for every tenant, sorted.
    paused_queues: tuple[str, ...] = ()

    def merge(self, other: TenantStatus) -> TenantStatus:
        """Both sides of a move as one: ``other`` (the target) wins each limit it sets; a
        pause on either side counts."""
        queues = tuple(sorted({*self.paused_queues, *other.paused_queues}))
        return TenantStatus(overlay(self.limits, other.limits), self.paused or other.paused, queues)


async def status_on(client: ShardClient, tenant: str) -> TenantStatus:
    """A tenant's limits and pauses as one shard holds them."""
    limits, paused = await asyncio.gather(client.limits(tenant), client.paused(tenant))
    return TenantStatus(limits, paused.tenant, tuple(sorted(paused.queues)))


def page_offset(token: str) -> int:
    """The position a numeric page token stands for (0 for none)."""
    if not token:
        return 0
    # isascii: str.isdigit() is also true of "²" and other digits int() refuses.
    if not (token.isascii() and token.isdigit()) or len(token) > 9:
        raise InvalidArgument("not a token from this listing", field="page_token")
    return int(token)


class TenantRouter:
    """A tenant's shard, or both sides of its move, behind one set of calls."""

    def __init__(self, pool: ShardPool, follower: ShardMapFollower) -> None:
        self.pool = pool
        self.follower = follower

    @property
    def shard_map(self) -> ShardMap:
        return self.follower.current

    def _side(self, shard_id: int) -> Side:
        client, coalescer = self.pool.get(shard_id)
        return Side(shard_id, client, coalescer)

    def route(self, tenant: str) -> Side:
        """The shard new work of ``tenant`` goes to (a move's target)."""
        return self._side(self.shard_map.shard_for(tenant))

    def sides(self, tenant: str) -> list[Side]:
        """Every shard that may hold ``tenant``'s jobs: while it moves, the source first and
        the target (where ``route`` sends new work) last; otherwise just the one."""
        return [self._side(sid) for sid in reversed(self.shard_map.shards_for(tenant))]

    async def current_sides(self, tenant: str) -> list[Side]:
        """``sides`` after reading the map's version from the database (a move that started a
        moment ago is seen even before its notification arrives)."""
        await self.follower.refresh()
        return self.sides(tenant)

    async def catch_up(self, version: int, timeout_s: float = 3.0) -> None:
        """Wait until this replica follows map ``version`` (a shard refused an older one)."""
        try:
            await self.follower.refresh()
            await self.follower.wait_for_version(version, timeout_s)
        except TimeoutError:
            raise Unavailable(f"the shard map is changing (version {version}); retry") from None

    # --- jobs -------------------------------------------------------------------------

    async def _find(self, tenant: str, job_id: str) -> tuple[Side, JobRecord]:
        found: tuple[Side, JobRecord] | None = None
        for side in self.sides(tenant):
            try:
                found = (side, await side.client.get_job(tenant, job_id))
            except NotFound:
                continue
        if found is None:
            raise NotFound(f"no job {job_id}", field="job_id")
        return found

    async def find_job(self, tenant: str, job_id: str) -> PlacedJob:
        """The job wherever it is during a move. The source is read first: the mover deletes
        there only after the target has the job, so a job missed on the source is on the
        target. When both have it (copied, not yet deleted) the target's is the live one."""
        side, record = await self._find(tenant, job_id)
        return PlacedJob(side.shard_id, record)

    async def find_job_by_request_id(self, tenant: str, request_id: str) -> PlacedJob:
        """The job first submitted with ``request_id``, while a shard still remembers it for
        deduplication; during a move either side may hold the dedupe key."""
        for side in self.sides(tenant):
            (entry,) = await side.client.dedupe_entries(tenant, [request_id])
            if entry is not None:
                return await self.find_job(tenant, entry.job_id)
        raise NotFound(f"no job with request_id {request_id}", field="request_id")

    async def submit(
        self,
        tenant: str,
        jobs: Sequence[NewJob | ShardqError],
        *,
        coalesce: bool,
        turn: Turn | None = None,
    ) -> list[Submitted | ShardqError]:
        """Submit ``jobs`` to the tenant's shard; per job, what it became or its error (an
        error given in place of a job is passed through). Jobs a shard refuses as routed
        with an old map (a move started) are routed again once this replica has caught up.

        ``coalesce``: a lone job shares a round trip with concurrent submits to its shard.
        ``turn``: the jobs are one piece of a :class:`~shardq.shard.client.Row`, sent in its
        place there.
        """
        out: list[Submitted | ShardqError | None] = [
            j if isinstance(j, ShardqError) else None for j in jobs
        ]
        todo = {i: j for i, j in enumerate(jobs) if not isinstance(j, ShardqError)}
        for _ in range(MAX_REROUTES):
            version = self.shard_map.version
            side = self.route(tenant)
            now = side.client.clock.now_ms()
            prepared: dict[int, PreparedJob] = {}
            for i, new_job in todo.items():
                try:
                    prepared[i] = side.client.prepare(new_job, now)
                except ShardqError as exc:
                    out[i] = exc
            try:
                results = await self._enqueue(
                    tenant, side, list(prepared.values()), now, version, coalesce, turn
                )
            finally:
                if turn is not None:  # had, or not needed (every job known): the next may go
                    turn.skip()
                    turn = None  # a piece routed again (STALE_MAP) has had its place
            again, needed = {}, 0
            for (i, job), result in zip(prepared.items(), results, strict=True):
                if result.code is ItemCode.STALE_MAP:
                    again[i] = todo[i]
                    needed = max(needed, result.retry_after_ms)
                else:
                    out[i] = Submitted(job, result, side.shard_id)
            todo = again
            if not todo:
                return [o for o in out if o is not None]
            await self.catch_up(needed)
        raise Unavailable("the shard map kept changing under this submit; retry")

    async def _enqueue(
        self,
        tenant: str,
        side: Side,
        jobs: list[PreparedJob],
        now_ms: int,
        map_version: int,
        coalesce: bool,
        turn: Turn | None = None,
    ) -> list[EnqueueResult]:
        known = await self.moved_duplicates(tenant, jobs)
        fresh = [k for k, res in enumerate(known) if res is None]
        batch = [jobs[k] for k in fresh]
        results: list[EnqueueResult]
        if not batch:
            results = []
        elif coalesce and len(batch) == 1:
            results = [await side.coalescer.submit(batch[0], map_version)]
        else:
            results = await side.client.enqueue_prepared(batch, now_ms, map_version, turn)
        for k, result in zip(fresh, results, strict=True):
            known[k] = result
        return [res for res in known if res is not None]

    async def moved_duplicates(
        self, tenant: str, jobs: Sequence[PreparedJob]
    ) -> list[EnqueueResult | None]:
        """For a moving tenant: the answer for each prepared job whose request_id the move's
        source still knows (its dedupe key is not copied yet), else None. Submits go to the
        target, whose own dedupe covers every key already copied; no job is made twice."""
        move = self.shard_map.moves.get(tenant)
        if move is None or not jobs:
            return [None] * len(jobs)
        source = self.pool.get(move.from_shard_id)[0]
        entries = await source.dedupe_entries(tenant, [j.request_id for j in jobs])
        out: list[EnqueueResult | None] = []
        for job, entry in zip(jobs, entries, strict=True):
            if entry is None:
                out.append(None)
                continue
            code = ItemCode.DEDUPLICATED if entry.digest == job.digest else ItemCode.CONFLICT
            try:
                state = (await self.find_job(tenant, entry.job_id)).record.state
            except NotFound:
                state = JobState.UNKNOWN
            out.append(EnqueueResult(code, entry.job_id, state, 0))
        return out

    async def cancel(
        self, tenant: str, job_id: str, max_tries: int = MAX_REROUTES * 10
    ) -> PlacedJob:
        """Cancel the job on its side and read it back. A job that its tenant's move has set
        aside (MOVING: off the source's queues, not yet on the target) is carried over to the
        target here and now (``carry_over``), then cancelled there: the cancel waits neither
        for the mover nor, if it died, for the next one."""
        for _ in range(max_tries):
            side, record = await self._find(tenant, job_id)
            if record.state is JobState.CANCELLED:
                break
            code, _ = await side.client.cancel(tenant, job_id)
            if code is not ItemCode.MOVING:
                record = await side.client.get_job(tenant, job_id)
                break
            if not await self.carry_over(tenant, job_id):
                await asyncio.sleep(CANCEL_RETRY_S)  # the move ended meanwhile: look again
        else:
            raise Unavailable("the job's tenant is being moved to another shard; retry")
        return PlacedJob(side.shard_id, record)

    def _move_sides(self, tenant: str) -> tuple[ShardSide, ShardSide] | None:
        """(source, target) of the tenant's move in progress, None when it is not moving."""
        move = self.shard_map.moves.get(tenant)
        if move is None or move.from_shard_id == move.to_shard_id:
            return None
        source = ShardSide(self.pool.get(move.from_shard_id)[0], tenant)
        return source, ShardSide(self.pool.get(move.to_shard_id)[0], tenant)

    async def set_aside(self, tenant: str) -> list[JobRecord]:
        """The tenant's jobs its move has taken off the source's queues and the target has
        not got yet: in no queue and no count on either side, and still its jobs (counted,
        listed; a mover that died leaves them so until the next one resumes). Few: a mover
        copies each batch it takes before taking another."""
        sides = self._move_sides(tenant)
        if sides is None:
            return []
        source, target = sides
        records = await source.set_aside()
        # Copied but not yet dropped on the source: the target's counts and lists have them.
        there = await target.holds([r.job_id for r in records])
        return [r for r in records if r.job_id not in there]

    async def carry_over(self, tenant: str, job_id: str) -> bool:
        """Copy one set-aside job to its move's target and drop it on the source, the mover's
        own steps (``shard.moving``: each skips what is done, so racing the mover ends as if
        only one of them had); False when the tenant is not moving any more."""
        sides = self._move_sides(tenant)
        if sides is None:
            return False
        source, target = sides
        jobs = await source.read_jobs([job_id])
        if jobs:
            await target.put(jobs=jobs)
        await source.drop(job_ids=[job_id])
        return True

    async def list_jobs(
        self,
        tenant: str,
        state: JobState,
        page_size: int,
        page_token: str,
        encode: Callable[[JobRecord, int], T],
        size_of: Callable[[T], int],
        max_bytes: int,
    ) -> tuple[list[T], str]:
        """One page of the tenant's jobs in ``state``, each as ``encode(record, shard_id)``,
        that fits in ``max_bytes`` (as ``size_of`` measures them): asked again with fewer jobs
        while it does not, so the page token the shard gives is the right one for what is
        sent. Returns (items, next page token).

        While the tenant moves, the listing walks the target, then the source, then the jobs
        the move has set aside (``set_aside``): the token is then ``m<part>.<the part's
        token>``."""
        sides = list(reversed(self.sides(tenant)))
        at, inner = 0, page_token
        if page_token.startswith("m"):
            head, _, inner = page_token[1:].partition(".")
            at = page_offset(head) if head else -1
            if at not in (0, 1, 2):
                raise InvalidArgument("not a token from this listing", field="page_token")
        parts = len(sides) + 1 if len(sides) > 1 else 1
        if at >= parts:
            return [], ""  # the move ended while paging: the target's part was listed
        if at == len(sides):
            return await self._list_set_aside(
                tenant, state, page_size, inner, encode, size_of, max_bytes
            )
        side, size = sides[at], page_size
        while True:
            page = await side.client.list_jobs(tenant, state, size, inner)
            items = [encode(r, side.shard_id) for r in page.jobs]
            total = sum(size_of(item) for item in items)
            if total <= max_bytes or size == 1:
                break
            size = max(1, min(size - 1, size * max_bytes // total))
        token = page.next_page_token
        if len(sides) > 1 or page_token.startswith("m"):
            if token:
                token = f"m{at}.{token}"
            elif at + 1 < parts:
                token = f"m{at + 1}."
                if not items:  # nothing in this part: the next one's page, not an empty one
                    return await self.list_jobs(
                        tenant, state, page_size, token, encode, size_of, max_bytes
                    )
        return items, token

    async def _list_set_aside(
        self,
        tenant: str,
        state: JobState,
        page_size: int,
        inner: str,
        encode: Callable[[JobRecord, int], T],
        size_of: Callable[[T], int],
        max_bytes: int,
    ) -> tuple[list[T], str]:
        """The last part of a moving tenant's listing: its set-aside jobs in ``state``, by
        job ID (as on the source, where they are)."""
        offset = page_offset(inner)
        chosen = [r for r in await self.set_aside(tenant) if r.state is state]
        source = self.sides(tenant)[0].shard_id
        size = page_size
        while True:
            items = [encode(r, source) for r in chosen[offset : offset + size]]
            total = sum(size_of(item) for item in items)
            if total <= max_bytes or size <= 1:
                break
            size = max(1, min(size - 1, size * max_bytes // total))
        end = offset + len(items)
        return items, f"m2.{end}" if end < len(chosen) else ""

    async def requeue_dead(
        self, tenant: str, job_ids: Sequence[str], every: bool = False
    ) -> tuple[int, list[str]]:
        """Dead jobs back to ready, on whichever side they are: ``job_ids``, or ``every`` dead
        job. Returns (requeued, the IDs that were no dead job of the tenant)."""
        total, missing = 0, list(job_ids)
        for side in self.sides(tenant):  # during a move, dead jobs may be on both
            client = side.client
            if not every:
                if missing:
                    n, missing = await client.requeue_dead(tenant, missing)
                    total += n
                continue
            while True:
                page = await client.list_jobs(tenant, JobState.DEAD, 500)
                if not page.jobs:
                    break
                n, _ = await client.requeue_dead(tenant, [j.job_id for j in page.jobs])
                total += n
        return total, [] if every else missing

    # --- schedules ------------------------------------------------------------------------

    async def create_schedule(
        self, tenant: str, spec: ScheduleSpec, max_schedules: int
    ) -> Schedule:
        """Create the schedule on the tenant's shard; creating an equal one again answers the
        existing one, and another one under its ID is AlreadyExists."""
        client = self.route(tenant).client
        existing = await client.get_schedule(tenant, spec.schedule_id)
        if existing is not None:
            if not existing.same_definition(spec):
                raise AlreadyExists("another schedule has this ID", field="schedule_id")
            current = next(
                (
                    s
                    for s in await client.list_schedules(tenant)
                    if s.spec.schedule_id == spec.schedule_id
                ),
                None,
            )
            if current is not None:  # else deleted meanwhile: create it again below
                return current
        return await client.upsert_schedule(tenant, spec, max_schedules)

    async def list_schedules(self, tenant: str) -> list[Schedule]:
        """Every schedule of the tenant, by ID; during a move, the target's copy wins."""
        by_id = {}
        for side in self.sides(tenant):  # the target last
            by_id.update({s.spec.schedule_id: s for s in await side.client.list_schedules(tenant)})
        return [by_id[k] for k in sorted(by_id)]

    async def delete_schedule(self, tenant: str, schedule_id: str) -> None:
        deleted = False
        for side in self.sides(tenant):  # during a move it may be on either side
            try:
                await side.client.delete_schedule(tenant, schedule_id)
                deleted = True
            except NotFound:
                continue
        if not deleted:
            raise NotFound(f"no schedule {schedule_id}", field="schedule_id")

    # --- limits and pauses -----------------------------------------------------------------

    async def set_limits(self, tenant: str, limits: TenantLimits) -> list[int]:
        """Give ``limits`` to every shard that holds the tenant: both sides while it moves,
        and any side a move started meanwhile adds (the map is read again after each round
        until no new side appears). Returns the shards written."""
        written: set[int] = set()
        for _ in range(MAX_REROUTES):
            todo = [s for s in await self.current_sides(tenant) if s.shard_id not in written]
            if not todo:
                return sorted(written)
            for side in todo:
                await side.client.set_limits(tenant, limits)
                written.add(side.shard_id)
        raise Unavailable("the shard map kept changing while the limits were pushed; retry")

    async def pause(self, tenant: str | None, queue: str | None, *, resume: bool = False) -> None:
        """Pause (or resume) a tenant, a tenant's queue, or a queue on every shard of the map.
        A tenant's pause goes to both sides while it moves."""
        if tenant is None:
            await self.follower.refresh()
            clients = [self.pool.get(sid)[0] for sid in sorted(self.shard_map.shards)]
        else:
            clients = [side.client for side in await self.current_sides(tenant)]
        for client in clients:
            if resume:
                await client.resume(tenant=tenant, queue=queue)
            else:
                await client.pause(tenant=tenant, queue=queue)

    # --- load -----------------------------------------------------------------------------

    async def tenant_load(self, tenant: str) -> tuple[int, TenantLoad]:
        """(the tenant's shard, its load): during a move, the sum of both sides and of the
        jobs the move has set aside (counted on neither side while it copies them)."""
        shard_id = self.route(tenant).shard_id
        parts = [await side.client.tenant_load(tenant) for side in self.sides(tenant)]
        return shard_id, _sum_loads([*parts, _load_of(tenant, await self.set_aside(tenant))])

    async def tenant_status(self, tenant: str) -> TenantStatus:
        """The tenant's limits and pauses as its shard holds them: during a move, both sides
        merged (the target's limits first, either side's pauses)."""
        parts = [await status_on(side.client, tenant) for side in self.sides(tenant)]
        status = parts[0]
        for more in parts[1:]:
            status = status.merge(more)
        return status

    async def tenant_loads(
        self, shard_id: int | None, page_size: int, page_token: str
    ) -> tuple[list[tuple[int, TenantLoad, TenantStatus]], str]:
        """A page of (shard, load, status) of every tenant on ``shard_id``, or on every shard,
        by shard then tenant; each side of a move counts apart, the jobs the move has set aside
        (on neither side's counts) with its source. Returns (page, next token)."""
        shards = self.pool.all()
        if shard_id is not None:
            if shard_id not in shards:
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            shards = {shard_id: shards[shard_id]}
        offset = page_offset(page_token)
        pairs = [(sid, t) for sid in sorted(shards) for t in await shards[sid].tenants()]
        chosen = pairs[offset : offset + page_size]
        loads = [await shards[sid].tenant_load(t) for sid, t in chosen]
        for i, (sid, t) in enumerate(chosen):
            move = self.shard_map.moves.get(t)
            if move is not None and move.from_shard_id == sid != move.to_shard_id:
                loads[i] = _sum_loads([loads[i], _load_of(t, await self.set_aside(t))])
        statuses: list[TenantStatus] = []
        for i in range(0, len(chosen), STATUS_CONCURRENCY):
            statuses += await asyncio.gather(
                *(status_on(shards[sid], t) for sid, t in chosen[i : i + STATUS_CONCURRENCY])
            )
        page = [
            (sid, load, status)
            for (sid, _), load, status in zip(chosen, loads, statuses, strict=True)
        ]
        return page, str(offset + page_size) if offset + page_size < len(pairs) else ""


def _load_of(tenant: str, records: list[JobRecord]) -> TenantLoad:
    """The load that ``records`` (jobs a move has set aside) add to the tenant's."""
    states = [r.state for r in records]
    return TenantLoad(
        tenant,
        scheduled=states.count(JobState.SCHEDULED),
        ready=states.count(JobState.READY),
        dead=states.count(JobState.DEAD),
    )


def _sum_loads(parts: list[TenantLoad]) -> TenantLoad:
    """One tenant's loads added up, field by field (the latest reading's time)."""
    load = parts[0]
    for more in parts[1:]:
        load = dataclasses.replace(
            load,
            **{
                f.name: getattr(load, f.name) + getattr(more, f.name)
                for f in dataclasses.fields(load)
                if f.name not in ("tenant", "at_ms")
            },
            at_ms=max(load.at_ms, more.at_ms),
        )
    return load
