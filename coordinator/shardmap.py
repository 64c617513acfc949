"""The shard map in Postgres: one source of truth that every replica and worker follows.

:class:`ShardMapStore` reads and changes it. Every change is one transaction that first locks
the version row (``SELECT ... FOR UPDATE``, so concurrent changers take turns and each sees
the other's result), writes only what changed, bumps the version and sends
``NOTIFY shardq_map, '<version>'`` — delivered at commit, so a listener that reloads on it
always sees the change. A call that changes nothing bumps nothing, so the CLI and Helm hooks
can repeat ``sync`` freely.

:class:`ShardMapFollower` keeps a replica's copy current: LISTEN for the push, plus a cheap
version poll so a notification lost to a dropped connection still converges within
``poll_interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

import psycopg
import sqlalchemy as sa
from psycopg.rows import TupleRow
from redis.exceptions import RedisError
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from shardq.common import validation
from shardq.common.errors import FailedPrecondition, InvalidArgument, NotFound
from shardq.common.placement import SHARD_STATES, SLOT_COUNT, slot_of
from shardq.common.redis import is_sentinel, parse_sentinel
from shardq.coordinator.placement import ShardInfo, ShardMap, TenantMove, balance_slots
from shardq.coordinator.shardcheck import AddressChange
from shardq.store import db

log = logging.getLogger("shardq.coordinator.shardmap")

#: The mover lease's advisory-lock key (``coordinator.moverd``; one per database): "sqmv" in
#: ASCII, below 2**31 so that ``pg_locks`` shows it as ``classid = 0, objid = LEASE_KEY``.
LEASE_KEY = 0x73716D76

#: What reaching a shard's Redis can raise: it is down, or not Redis at all.
SHARD_ERRORS = (RedisError, OSError, TimeoutError)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class MapNotInitialized(FailedPrecondition):
    """No shard map yet: ``shardq shards init`` (or ``sync_shards``) has not run."""


class MapChangeRefused(FailedPrecondition, ValueError):
    """A well-formed change the map cannot take now (e.g. removing shards that own slots)."""


def _check_address(address: object, index: int, field: str = "") -> str:
    field = field or f"addresses[{index}]"
    if not isinstance(address, str):
        raise InvalidArgument("must be a host:port string", field=field)
    if is_sentinel(address):  # a Sentinel group that names the shard's primary
        try:
            parse_sentinel(address)
        except InvalidArgument as exc:
            raise InvalidArgument(exc.message, field=field) from None
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"{address!r} is not host:port", field=field)
    return address


def _check_weight(weight: object, field: str) -> int:
    return validation.int_in_range(weight, 0, 1_000_000, field)


class MoverLeaseLost(FailedPrecondition):
    """A move was to be finished by a mover whose lease another mover has taken since."""


class Preview(Exception):
    """Raised (and rolled back) by a change made with ``ShardMapStore.preview`` set."""

    def __init__(self, after: ShardMap, before: ShardMap | None = None) -> None:
        super().__init__(f"preview of map version {after.version}")
        self.after = after
        #: The map the change started from (read under the version lock): what ``after`` is
        #: to be compared with, also when another change committed since the caller's read.
        self.before = before


class AddressChecks(Protocol):
    """What a change that introduces addresses asks first (``coordinator.shardcheck``)."""

    async def check(self, changes: Sequence[AddressChange], *, mark: bool) -> None:
        """Refuse (AddressRefused) unless every address may be used; ``mark``: then write
        each one's shard identity."""

    async def mark(self, address: str, shard_id: int) -> None:
        """Write the address's shard identity (refused if it holds another shard's)."""


class ShardDirectory(Protocol):
    """What a placement change needs from the shards themselves (``coordinator.mover``)."""

    async def fence(self, info: ShardInfo, version: int, undo: bool = False) -> None:
        """Refuse submits routed with a map older than ``version`` (``undo``: take it back)."""

    async def tenants(self, info: ShardInfo) -> list[str]:
        """Every tenant that has or had jobs on the shard."""

    async def copy_started(self, info: ShardInfo, tenant: str) -> bool:
        """Whether a move of ``tenant`` off this (source) shard has taken anything yet."""


class ShardMapStore:
    """Reads and changes the shard map; every method is one transaction.

    Given a :class:`ShardDirectory`, a change that takes tenants off a shard also starts
    their moves (see :meth:`_start_moves`); without one (tests of the map alone, a first
    ``init``) only the placement changes.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        directory: ShardDirectory | None = None,
        checks: AddressChecks | None = None,
    ) -> None:
        self._engine = engine
        self._directory = directory
        #: Given, every new or changed address is checked before the change commits (and
        #: marked with its shard's ID); without (tests of the map alone) none is.
        self._checks = checks
        #: Addresses the change in progress checked, marked just before it commits.
        self._to_mark: list[AddressChange] = []
        #: When set, a change goes as far as computing its result (and its moves), then rolls
        #: back with :class:`Preview`: what ``shardq`` shows before asking.
        self.preview = False
        #: The version the last change through this store committed as; None when it changed
        #: nothing (a no-op, or made meanwhile by another command). A command's moves are
        #: those of *its* version (``moves_of_change``): a change that found nothing to do must
        #: not adopt the version, and so the moves, another command's change committed as.
        self.committed: int | None = None

    async def version(self) -> int:
        """The current version (0 before the map exists): one indexed single-row read."""
        async with self._engine.connect() as conn:
            found = await conn.scalar(
                sa.select(db.map_version.c.version).where(db.map_version.c.id == 1)
            )
        return int(found or 0)

    async def load(self) -> ShardMap:
        """The whole map, read from one snapshot so version and contents always agree."""
        async with self._engine.connect() as plain:
            conn = await plain.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                version = await conn.scalar(
                    sa.select(db.map_version.c.version).where(db.map_version.c.id == 1)
                )
                found = await self._read(conn, int(version or 0))
        if found is None:
            raise MapNotInitialized("no shard map yet: run `shardq shards init`")
        return found

    async def sync_shards(
        self, addresses: Sequence[str], weights: Sequence[int] | None = None
    ) -> ShardMap:
        """Make shards ``0..N-1`` have ``addresses`` (and ``weights``), creating the map on the
        first call and giving new shards their share of slots.

        ``weights=None`` keeps existing shards' weights and gives new ones 1. Fewer addresses
        than shards is refused: removing a shard needs its tenants moved off first.
        """
        if not addresses:
            raise InvalidArgument("at least one shard address is needed", field="addresses")
        checked = [_check_address(a, i) for i, a in enumerate(addresses)]
        if len(set(checked)) != len(checked):
            raise InvalidArgument("two shards cannot share an address", field="addresses")
        if weights is not None:
            if len(weights) != len(checked):
                raise InvalidArgument(
                    f"{len(weights)} weights for {len(checked)} addresses", field="weights"
                )
            weights = [_check_weight(w, f"weights[{i}]") for i, w in enumerate(weights)]

        async with self._changing() as (conn, version, fenced):
            before = await self._read(conn, version)
            existing = dict(before.shards) if before else {}
            if len(checked) < len(existing):
                raise MapChangeRefused(
                    f"the map has {len(existing)} shards and {len(checked)} addresses were "
                    "given: removing shards is not supported (drain them first)"
                )
            await self._check_addresses(
                before,
                [(sid, a) for sid, a in enumerate(checked)
                 if sid not in existing or existing[sid].address != a],
            )  # fmt: skip
            changed = False
            for shard_id, address in enumerate(checked):
                old = existing.get(shard_id)
                weight = weights[shard_id] if weights else (old.weight if old else 1)
                if old is None:
                    await conn.execute(
                        sa.insert(db.shards).values(
                            shard_id=shard_id, address=address, weight=weight
                        )
                    )
                elif (old.address, old.weight) != (address, weight):
                    await conn.execute(
                        sa.update(db.shards)
                        .where(db.shards.c.shard_id == shard_id)
                        .values(address=address, weight=weight)
                    )
                else:
                    continue
                existing[shard_id] = ShardInfo(
                    shard_id, address, weight, old.state if old else "active"
                )
                changed = True
            changed |= await self._rebalance(conn, before, existing)
            return await self._commit(conn, version, changed, before, fenced)

    async def set_address(self, shard_id: int, address: str) -> ShardMap:
        """Point shard ``shard_id`` at another Redis that holds its data (a re-point: the
        Redis moved, its data with it); no job moves. The new address must pass the checks
        and carry this shard's identity, unless the shard owns nothing (drained)."""
        address = _check_address(address, 0, "address")
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            old = before.shards.get(shard_id)
            if old is None:
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            if old.address == address:
                return before
            for other in before.shards.values():
                if other.address == address:
                    raise InvalidArgument(
                        f"shard {other.shard_id} is at {address}", field="address"
                    )
            await self._check_addresses(before, [(shard_id, address)])
            await conn.execute(
                sa.update(db.shards).where(db.shards.c.shard_id == shard_id).values(address=address)
            )
            return await self._commit(conn, version, True, before, fenced)

    async def _check_addresses(
        self, before: ShardMap | None, changes: Sequence[tuple[int, str]]
    ) -> None:
        """Check (and unless previewing, mark) ``(shard_id, address)`` pairs, each a new
        shard or an existing shard's new address; a refusal ends the change uncommitted."""
        if self._checks is None or not changes:
            return
        todo = []
        for shard_id, address in changes:
            repoint = before is not None and shard_id in before.shards
            emptied = before is None or not repoint or before.owns_nothing(shard_id)
            todo.append(AddressChange(shard_id, address, repoint=repoint, emptied=emptied))
        await self._checks.check(todo, mark=False)
        self._to_mark += todo

    async def set_weight(self, shard_id: int, weight: int) -> ShardMap:
        """Change a shard's share of slots and move the fewest slots to match; 0 empties it."""
        return await self._update_shard(shard_id, weight=_check_weight(weight, "weight"))

    async def set_state(self, shard_id: int, state: str) -> ShardMap:
        """``draining`` gives the shard's slots to the others (moving its tenants, given a
        directory); ``active`` takes a share back."""
        if state not in SHARD_STATES:
            raise InvalidArgument(f"not one of {SHARD_STATES}", field="state")
        return await self._update_shard(shard_id, state=state)

    async def _update_shard(self, shard_id: int, **values: int | str) -> ShardMap:
        """Set a shard's weight or state, and re-balance the slots under the new weights."""
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            old = before.shards.get(shard_id)
            if old is None:
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            new = dataclasses.replace(old, **values)  # type: ignore[arg-type]
            if new == old:
                return before
            await conn.execute(
                sa.update(db.shards).where(db.shards.c.shard_id == shard_id).values(**values)
            )
            await self._rebalance(conn, before, {**before.shards, shard_id: new})
            return await self._commit(conn, version, True, before, fenced)

    async def pin(self, tenant_id: str, shard_id: int) -> ShardMap:
        """Send ``tenant_id``'s work to ``shard_id`` whatever its slot says (and move the
        jobs it already has there, given a directory)."""
        validation.tenant_id(tenant_id)
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            if shard_id not in before.shards:
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            if before.pins.get(tenant_id) == shard_id:
                return before
            await self._write_pin(conn, tenant_id, shard_id)
            return await self._commit(conn, version, True, before, fenced)

    async def unpin(self, tenant_id: str) -> bool:
        """Return ``tenant_id`` to its slot's shard; False when it was not pinned."""
        validation.tenant_id(tenant_id)
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            deleted = await conn.execute(sa.delete(db.pins).where(db.pins.c.tenant_id == tenant_id))
            if not deleted.rowcount:
                return False
            await self._commit(conn, version, True, before, fenced)
            return True

    async def add_shard(self, address: str, weight: int = 1) -> ShardMap:
        """A new shard (the next ID) at ``address``, given its share of slots."""
        before = await self.load()
        addresses = [before.shards[s].address for s in sorted(before.shards)]
        weights = [before.shards[s].weight for s in sorted(before.shards)]
        if sorted(before.shards) != list(range(len(addresses))):
            raise MapChangeRefused("shard IDs are not 0..N-1: use `shards sync`")
        return await self.sync_shards([*addresses, address], [*weights, weight])

    async def remove_shard(self, shard_id: int, *, forget_unreachable: bool = False) -> ShardMap:
        """Take an empty shard out of the map: it must have no pin, take part in no move, and
        (given a directory) hold no tenant; the slots it still owns go to the others in the
        same change. Only the highest ID can go, so shard IDs stay 0..N-1.

        ``forget_unreachable``: a shard that cannot be reached is taken out unchecked (a
        mistyped ``shards add`` that never received a job); any job it holds is lost."""
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            info = before.shards.get(shard_id)
            if info is None:
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            if shard_id != max(before.shards):
                raise MapChangeRefused(f"only the last shard ({max(before.shards)}) can be removed")
            if len(before.shards) == 1:
                raise MapChangeRefused("the last shard of the map cannot be removed")
            busy = []
            if before.tenants_pinned_to(shard_id):
                busy.append(f"has pinned tenants {before.tenants_pinned_to(shard_id)}")
            if before.tenants_moving_from(shard_id) or before.tenants_moving_to(shard_id):
                busy.append("takes part in moves still in progress (`shardq moves run`, or "
                            "`shardq moves abort`)")  # fmt: skip
            if not busy and self._directory is not None:
                try:
                    left = await self._directory.tenants(info)
                except SHARD_ERRORS as exc:
                    if not forget_unreachable:
                        raise MapChangeRefused(
                            f"shard {shard_id} ({info.address}) cannot be reached "
                            f"({_one_line(exc)}): cannot tell that it holds no jobs "
                            "(`--forget-unreachable` removes it anyway, losing any it holds)"
                        ) from None
                    log.warning("removing unreachable shard %d (%s)", shard_id, info.address)
                    left = []
                if left:
                    busy.append(f"still holds tenants {left[:10]} (drain it first)")
            if busy:
                raise MapChangeRefused(f"shard {shard_id} cannot be removed: " + "; ".join(busy))
            remaining = {sid: i for sid, i in before.shards.items() if sid != shard_id}
            await self._rebalance(conn, before, remaining)
            await conn.execute(sa.delete(db.shards).where(db.shards.c.shard_id == shard_id))
            return await self._commit(conn, version, True, before, fenced)

    async def abort_moves(self, tenants: Sequence[str] | None = None) -> ShardMap:
        """Undo the moves in progress (``tenants``' only, if given) that have not copied
        anything yet: each tenant is placed on its source again (its slot, or a pin) and its
        move mark dropped. Refused, naming them, when a move has started copying or its
        target already holds jobs of the tenant (submitted since): those must run.

        The sources' fences need no undoing: they refuse maps older than the change, and
        this one is newer. A target that cannot be reached cannot have taken jobs since it
        went away; what it took before is left there (see docs/operating.md)."""
        if self._directory is None:
            raise FailedPrecondition("aborting moves needs the shards (not --map-only)")
        async with self._changing() as (conn, version, _):
            before = await self._require(conn, version)
            unknown = sorted(set(tenants or ()) - set(before.moves))
            if unknown:
                raise NotFound(f"no move in progress for {', '.join(unknown)}", field="tenant_id")
            moves = [m for t, m in sorted(before.moves.items()) if tenants is None or t in tenants]
            if not moves:
                return before
            await self._refuse_started(before, moves)
            slots: dict[int, int] = {}
            for move in moves:
                tenant, source = move.tenant_id, move.from_shard_id
                slot = slot_of(tenant)
                owner = slots.get(slot, before.slots[slot])
                if tenant not in before.pins and owner == move.to_shard_id and (slot not in slots):
                    slots[slot] = source  # the slot was what moved: it goes back
                elif slots.get(slot, before.slots[slot]) == source:
                    await conn.execute(sa.delete(db.pins).where(db.pins.c.tenant_id == tenant))
                else:
                    await self._write_pin(conn, tenant, source)
            if slots:
                await self._write_slots(conn, sorted(slots.items()))
            # Only moves no mover has started copying (``start_copying``): a mover's mark and
            # this delete serialize on the row, whichever comes second sees the other's.
            names = [m.tenant_id for m in moves]
            deleted = await conn.execute(
                sa.delete(db.moves).where(db.moves.c.tenant_id.in_(names), ~db.moves.c.copying)
            )
            if deleted.rowcount != len(moves):
                copying = await conn.scalars(
                    sa.select(db.moves.c.tenant_id)
                    .where(db.moves.c.tenant_id.in_(names), db.moves.c.copying)
                    .order_by(db.moves.c.tenant_id)
                )
                raise MapChangeRefused(
                    f"copying has started for tenants {', '.join(copying)}: those moves "
                    "cannot be aborted, let them finish (`shardq moves run`)"
                )
            new_version = await self._bump(conn, version)
            after = await self._read(conn, new_version)
            assert after is not None
            return after

    async def _refuse_started(self, smap: ShardMap, moves: Sequence[TenantMove]) -> None:
        """Refuse (naming the tenants) unless no move of ``moves`` has begun."""
        assert self._directory is not None
        started, held = [], []
        on_target: dict[int, set[str] | None] = {}
        for move in moves:
            source = smap.shards[move.from_shard_id]
            try:
                if await self._directory.copy_started(source, move.tenant_id):
                    started.append(move.tenant_id)
            except SHARD_ERRORS as exc:
                raise MapChangeRefused(
                    f"shard {source.shard_id} ({source.address}) cannot be reached "
                    f"({_one_line(exc)}): cannot tell whether copying started"
                ) from None
            target = smap.shards[move.to_shard_id]
            if target.shard_id not in on_target:
                try:
                    on_target[target.shard_id] = set(await self._directory.tenants(target))
                except SHARD_ERRORS as exc:
                    log.info("shard %d (%s) unreachable while aborting moves to it: %s",
                                target.shard_id, target.address, exc)  # fmt: skip
                    on_target[target.shard_id] = None
            if move.tenant_id in (on_target[target.shard_id] or ()):
                held.append(move.tenant_id)
        if started:
            raise MapChangeRefused(
                f"copying has started for tenants {', '.join(started)}: those moves cannot be "
                "aborted, let them finish (`shardq moves run`)"
            )
        if held:
            raise MapChangeRefused(
                f"tenants {', '.join(held)} already have jobs on their target shard: those "
                "moves cannot be aborted, let them finish (`shardq moves run`)"
            )

    async def place(self, slots: Mapping[int, int], pins: Mapping[str, int]) -> ShardMap:
        """Give ``slots`` (slot -> shard) and pin ``pins`` (tenant -> shard) in one change: a
        rebalance plan. Shard weights are not consulted; keep the slot counts per shard as
        they are (swap slots) or a later ``sync_shards`` re-balances the counts."""
        async with self._changing() as (conn, version, fenced):
            before = await self._require(conn, version)
            for shard_id in {*slots.values(), *pins.values()} - set(before.shards):
                raise NotFound(f"no shard {shard_id}", field="shard_id")
            changes = [(s, sid) for s, sid in sorted(slots.items()) if before.slots[s] != sid]
            if changes:
                await self._write_slots(conn, changes)
            new_pins = {t: sid for t, sid in pins.items() if before.pins.get(t) != sid}
            for tenant, shard_id in sorted(new_pins.items()):
                await self._write_pin(conn, validation.tenant_id(tenant), shard_id)
            return await self._commit(conn, version, bool(changes or new_pins), before, fenced)

    async def start_copying(self, move: TenantMove, lease_pid: int | None = None) -> bool:
        """Mark ``move`` as copying, just before its mover first takes anything off the
        source; False when its row is gone (aborted, or finished by another mover). Once
        marked, ``abort_moves`` refuses it. ``lease_pid`` as in ``finish_move``."""
        async with self._engine.begin() as conn:
            if lease_pid is not None and not await self._holds_lease(conn, lease_pid):
                raise MoverLeaseLost(f"the mover lease is no longer held by session {lease_pid}")
            marked = await conn.execute(
                sa.update(db.moves)
                .where(
                    db.moves.c.tenant_id == move.tenant_id,
                    db.moves.c.from_shard_id == move.from_shard_id,
                    db.moves.c.to_shard_id == move.to_shard_id,
                )
                .values(copying=True)
            )
            return bool(marked.rowcount)

    async def finish_move(self, move: TenantMove, lease_pid: int | None = None) -> bool:
        """Drop ``move``'s in-progress mark (its source holds nothing of the tenant any more);
        False when the mark was already gone. ``lease_pid``: only while that Postgres session
        holds the mover lease (``coordinator.moverd``), checked in the same transaction, so a
        mover that lost its lease cannot end a move another mover now runs."""
        async with self._changing() as (conn, version, _):
            if lease_pid is not None and not await self._holds_lease(conn, lease_pid):
                raise MoverLeaseLost(f"the mover lease is no longer held by session {lease_pid}")
            deleted = await conn.execute(
                sa.delete(db.moves).where(
                    db.moves.c.tenant_id == move.tenant_id,
                    db.moves.c.from_shard_id == move.from_shard_id,
                    db.moves.c.to_shard_id == move.to_shard_id,
                )
            )
            if not deleted.rowcount:
                return False
            await self._bump(conn, version)
            return True

    async def finish_moves(self, moves: Sequence[TenantMove], lease_pid: int | None = None) -> int:
        """``finish_move`` for many moves in one change: one version bump for them all (none
        when every mark was gone already); how many marks were dropped."""
        if not moves:
            return 0
        async with self._changing() as (conn, version, _):
            if lease_pid is not None and not await self._holds_lease(conn, lease_pid):
                raise MoverLeaseLost(f"the mover lease is no longer held by session {lease_pid}")
            dropped = 0
            for move in moves:
                deleted = await conn.execute(
                    sa.delete(db.moves).where(
                        db.moves.c.tenant_id == move.tenant_id,
                        db.moves.c.from_shard_id == move.from_shard_id,
                        db.moves.c.to_shard_id == move.to_shard_id,
                    )
                )
                dropped += deleted.rowcount
            if dropped:
                await self._bump(conn, version)
            return dropped

    @staticmethod
    async def _holds_lease(conn: AsyncConnection, pid: int) -> bool:
        found = await conn.scalar(
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = 0 AND objid = :key AND objsubid = 1 AND pid = :pid"
            ),
            {"key": LEASE_KEY, "pid": pid},
        )
        return bool(found)

    # -- inside a changing transaction --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[tuple[AsyncConnection, int, list[ShardInfo]]]:
        """One map-changing transaction: the version row locked, and the shards fenced on the
        way (``_start_moves``) unfenced again if the change does not commit."""
        fenced: list[ShardInfo] = []
        self._to_mark = []
        self.committed = None
        try:
            async with self._engine.begin() as conn:
                version = await self._lock(conn)
                yield conn, version, fenced
        except BaseException:
            if fenced and self._directory is not None:
                for info in fenced:
                    with contextlib.suppress(Exception):
                        await self._directory.fence(info, version + 1, undo=True)
            raise

    async def _start_moves(
        self, conn: AsyncConnection, before: ShardMap, version: int, fenced: list[ShardInfo]
    ) -> None:
        """Record a move for every tenant this change takes off a shard that holds it.

        Each shard that loses placement is fenced at the new version first and only then
        asked for its tenants: from that moment on, no coordinator still routing with the old
        map can add a tenant (or a job) there, so the list is complete, and a submit refused
        by the fence is retried with the new map, which sends it to the move's target.
        """
        after = await self._read(conn, version)
        assert after is not None
        for tenant, move in before.moves.items():
            if after.placed_on(tenant) != move.to_shard_id:
                raise MapChangeRefused(
                    f"tenant {tenant} is moving to shard {move.to_shard_id}: let that move "
                    "finish first (`shardq moves run`)"
                )
        if self._directory is None:
            return
        rows = []
        # A shard the change removes was found empty first (``remove_shard``): nothing to
        # fence or move, and it may be unreachable.
        for shard_id in sorted(before.losing_shards(after) & set(after.shards)):
            info = before.shards[shard_id]
            if not self.preview:
                await self._directory.fence(info, version + 1)
                fenced.append(info)
            for tenant in await self._directory.tenants(info):
                target = after.placed_on(tenant)
                if target != shard_id and tenant not in before.moves:
                    # The version this change commits as names the change: its command
                    # acts on these moves only (``moves_of_change``).
                    rows.append({"tenant_id": tenant, "from_shard_id": shard_id,
                                 "to_shard_id": target,
                                 "change_version": version + 1})  # fmt: skip
        if rows:
            await conn.execute(pg_insert(db.moves).values(rows).on_conflict_do_nothing())

    @staticmethod
    async def _lock(conn: AsyncConnection) -> int:
        """Lock the version row until commit, so changers serialize; returns the version."""
        # The migration creates the row; recreate it if someone deleted it.
        await conn.execute(
            pg_insert(db.map_version).values(id=1, version=0).on_conflict_do_nothing()
        )
        version = await conn.scalar(
            sa.select(db.map_version.c.version).where(db.map_version.c.id == 1).with_for_update()
        )
        return int(version or 0)

    @staticmethod
    async def _bump(conn: AsyncConnection, version: int) -> int:
        new = version + 1
        await conn.execute(
            sa.update(db.map_version).where(db.map_version.c.id == 1).values(version=new)
        )
        # Queued by Postgres and delivered only if and when this transaction commits.
        await conn.execute(sa.select(sa.func.pg_notify(db.MAP_CHANNEL, str(new))))
        return new

    async def _commit(
        self,
        conn: AsyncConnection,
        version: int,
        changed: bool,
        before: ShardMap | None,
        fenced: list[ShardInfo],
    ) -> ShardMap:
        if not changed and before is not None:
            return before
        if before is not None:
            await self._start_moves(conn, before, version, fenced)
        if self.preview:
            after = await self._read(conn, version + 1)
            assert after is not None
            raise Preview(after, before)
        if self._checks is not None:
            # Last, so a change refused on the way leaves no marker behind.
            for change in self._to_mark:
                await self._checks.mark(change.address, change.shard_id)
        new_version = await self._bump(conn, version)
        after = await self._read(conn, new_version)
        assert after is not None  # the transaction just wrote it
        self.committed = new_version
        return after

    async def _require(self, conn: AsyncConnection, version: int) -> ShardMap:
        found = await self._read(conn, version)
        if found is None:
            raise MapNotInitialized("no shard map yet: run `shardq shards init`")
        return found

    @staticmethod
    async def _rebalance(
        conn: AsyncConnection, before: ShardMap | None, shards: Mapping[int, ShardInfo]
    ) -> bool:
        """Rewrite the slots whose owner changes under ``shards``' weights; True if any did."""
        weights = {sid: info.effective_weight for sid, info in shards.items()}
        try:
            table = balance_slots(before.slots if before else None, weights)
        except ValueError as exc:
            raise MapChangeRefused(str(exc)) from None
        if before is None:
            changes = list(enumerate(table))
        else:
            changes = [(s, sid) for s, sid in enumerate(table) if before.slots[s] != sid]
        if not changes:
            return False
        await ShardMapStore._write_slots(conn, changes)
        return True

    @staticmethod
    async def _write_pin(conn: AsyncConnection, tenant_id: str, shard_id: int) -> None:
        stmt = pg_insert(db.pins).values(tenant_id=tenant_id, shard_id=shard_id)
        await conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[db.pins.c.tenant_id],
                set_={"shard_id": shard_id, "created_at": sa.func.now()},
            )
        )

    @staticmethod
    async def _write_slots(conn: AsyncConnection, changes: Sequence[tuple[int, int]]) -> None:
        # One statement however many slots move (a first init writes all 16,384).
        await conn.execute(
            sa.text(
                "INSERT INTO shardq_slots (slot, shard_id) "
                "SELECT * FROM unnest(CAST(:slots AS int[]), CAST(:shards AS int[])) "
                "ON CONFLICT (slot) DO UPDATE SET shard_id = EXCLUDED.shard_id"
            ),
            {"slots": [s for s, _ in changes], "shards": [sid for _, sid in changes]},
        )

    @staticmethod
    async def _read(conn: AsyncConnection, version: int) -> ShardMap | None:
        """The map as ``conn`` sees it, or None when there are no shards yet."""
        shard_rows = (await conn.execute(sa.select(db.shards))).all()
        if not shard_rows:
            return None
        shards = {
            r.shard_id: ShardInfo(r.shard_id, r.address, r.weight, r.state) for r in shard_rows
        }
        # One array rather than 16,384 rows: a replica reloads the map on every change.
        owners = await conn.scalar(
            sa.select(sa.func.array_agg(aggregate_order_by(db.slots.c.shard_id, db.slots.c.slot)))
        )
        slot_table = tuple(owners or ())
        if len(slot_table) != SLOT_COUNT:
            raise FailedPrecondition(
                f"the slot table has {len(slot_table)} of {SLOT_COUNT} slots: "
                "run `shardq shards sync`"
            )
        pins = {r.tenant_id: r.shard_id for r in (await conn.execute(sa.select(db.pins))).all()}
        moves = {
            r.tenant_id: TenantMove(
                r.tenant_id,
                r.from_shard_id,
                r.to_shard_id,
                int(r.started_at.timestamp() * 1000),
                int(r.change_version or 0),
            )
            for r in (await conn.execute(sa.select(db.moves))).all()
        }
        return ShardMap(
            version=version,
            shards=shards,
            slots=slot_table,
            pins=pins,
            moves=moves,
        )


MapCallback = Callable[[ShardMap], object]


class ShardMapFollower:
    """A replica's always-current copy of the shard map.

    Changes arrive by ``LISTEN shardq_map`` on a dedicated connection (a pooled connection
    cannot hold a LISTEN); every ``poll_interval_s`` the version is also compared, which
    catches a notification lost while the listen connection was down. Subscribers hear of
    each new version in order, from the event loop, never concurrently.
    """

    def __init__(
        self,
        store: ShardMapStore,
        dsn_for_listen: str,
        poll_interval_s: float = 0.5,
        *,
        retry_delay_s: float = 1.0,
    ) -> None:
        self._store = store
        self._dsn = db.psycopg_dsn(dsn_for_listen)
        self._poll_interval_s = poll_interval_s
        #: Pause before reconnecting the listen connection after it fails, in seconds.
        self._retry_delay_s = retry_delay_s
        self._current: ShardMap | None = None
        self._changed = asyncio.Event()
        self._callbacks: list[MapCallback] = []
        self._queues: list[asyncio.Queue[ShardMap]] = []
        self._reload_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._listen_failing = False
        self._calls = db.Uncancellable()

    @property
    def current(self) -> ShardMap:
        if self._current is None:
            raise RuntimeError("ShardMapFollower.start() has not completed")
        return self._current

    async def start(self) -> None:
        """Load the map (raises MapNotInitialized if there is none yet), then follow it."""
        if self._task is not None:
            return
        self._current = await self._store.load()
        self._task = asyncio.create_task(self._follow(), name="shardq-map-follower")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._calls.drain()

    def on_change(self, callback: MapCallback) -> Callable[[], None]:
        """Call ``callback(new_map)`` after each change; returns a function that unregisters it.

        Callbacks run inline on the event loop and must not block; an exception is logged.
        """
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    def subscribe(self) -> asyncio.Queue[ShardMap]:
        """A queue that receives every new map from now on (unbounded; maps are shared)."""
        queue: asyncio.Queue[ShardMap] = asyncio.Queue()
        self._queues.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[ShardMap]) -> None:
        with contextlib.suppress(ValueError):
            self._queues.remove(queue)

    async def wait_for_version(self, version: int, timeout_s: float) -> ShardMap:
        """The map once it is at ``version`` or newer; TimeoutError after ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            while self.current.version < version:
                changed = self._changed
                await changed.wait()
        return self.current

    async def refresh(self) -> ShardMap:
        """Reload now if the stored version differs from ours (cheap when it does not)."""
        async with self._reload_lock:
            if await self._store.version() != self.current.version:
                self._publish(await self._store.load())
        return self.current

    # -- the follow loop ----------------------------------------------------------------------

    async def _follow(self) -> None:
        conn: psycopg.AsyncConnection[TupleRow] | None = None
        try:
            while True:
                if conn is None:
                    conn = await self._listen()
                    await self._poll()  # whatever changed while we were not listening
                if conn is None:
                    await asyncio.sleep(self._retry_delay_s)
                else:
                    try:
                        await self._drain_notifications(conn)
                    except (psycopg.Error, OSError) as exc:
                        log.warning("shard map listen connection lost: %s", exc)
                        await _close_quietly(conn)
                        conn = None
                await self._poll()
        finally:
            if conn is not None:
                await _close_quietly(conn)

    async def _listen(self) -> psycopg.AsyncConnection[TupleRow] | None:
        try:
            conn: psycopg.AsyncConnection[TupleRow] = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True
            )
        except (psycopg.Error, OSError) as exc:
            self._log_listen_failure(exc)
            return None
        try:
            await conn.execute(f"LISTEN {db.MAP_CHANNEL}")
        except BaseException as exc:
            # Also on cancellation (a stop while connecting): never leave the connection open.
            await _close_quietly(conn)
            if not isinstance(exc, psycopg.Error | OSError):
                raise
            self._log_listen_failure(exc)
            return None
        self._listen_failing = False
        return conn

    def _log_listen_failure(self, exc: BaseException) -> None:
        # Once per outage, not once per retry; polling keeps the map current meanwhile.
        level = logging.DEBUG if self._listen_failing else logging.WARNING
        log.log(level, "cannot LISTEN for shard map changes (polling instead): %s", exc)
        self._listen_failing = True

    async def _drain_notifications(self, conn: psycopg.AsyncConnection[TupleRow]) -> None:
        """Handle notifications for up to ``poll_interval_s``, then return for a poll."""
        async for note in conn.notifies(timeout=self._poll_interval_s):
            try:
                announced = int(note.payload)
            except ValueError:
                announced = self.current.version + 1  # unknown payload: just look
            if announced > self.current.version:  # a burst of changes reloads once
                await self._reload_safely()

    async def _poll(self) -> None:
        try:
            await self._calls.run(self.refresh())
        except (SQLAlchemyError, OSError, FailedPrecondition) as exc:
            log.warning("cannot read the shard map version: %s", exc)

    async def _reload_safely(self) -> None:
        try:
            async with self._reload_lock:
                self._publish(await self._calls.run(self._store.load()))
        except (SQLAlchemyError, OSError, FailedPrecondition) as exc:
            log.warning("cannot reload the shard map: %s", exc)

    def _publish(self, new: ShardMap) -> None:
        old = self._current
        if old is not None and old.version == new.version:
            return
        self._current = new
        log.info("shard map version %s -> %d", old.version if old else None, new.version)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for callback in list(self._callbacks):
            try:
                callback(new)
            except Exception:
                log.exception("shard map subscriber %r failed", callback)
        for queue in self._queues:
            queue.put_nowait(new)


async def _close_quietly(conn: psycopg.AsyncConnection[TupleRow]) -> None:
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
