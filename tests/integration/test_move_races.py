"""Who acts on a tenant move, when two parties reach for it at once: a ``shardq moves run``
whose mover lease is taken from it mid-pass, two commands making the same placement change,
``moves abort`` and a mover's first take queued on the same move, and a finished move's mark
while the pass waits for another tenant. Through the real ``shardq`` command (a process of
its own, answering its prompt on a terminal) against a real cluster: redis-server shards,
Postgres, a coordinator (which runs no moves itself here).

Orderings are made with Postgres' own row locks (a test transaction holds the move's row
while the parties queue behind it, seen waiting in ``pg_stat_activity``), never with sleeps.
"""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import psycopg
from psycopg.rows import TupleRow

from shardq.coordinator.moverd import APP_PREFIX, lease_holder
from shardq.coordinator.shardmap import LEASE_KEY
from shardq.coordinator.tools.redis_server import parent_death_prefix
from shardq.shard.client import ShardClient
from shardq.shard.models import Lease
from shardq.store import db
from tests.integration.test_mover_failover import load_map
from tests.integration.test_tenant_moves_commands import shardq, submit, tenants_on
from tests.support.cluster import Cluster, running_cluster
from tests.support.coordinator_proc import wait_for

CLI = "import sys; from shardq.coordinator.cli import main; sys.exit(main())"


class Background:
    """``shardq WORDS...`` left running in a process of its own: its output read as it comes,
    its stdin a terminal (a pty), so that without ``--yes`` it asks, and the test answers."""

    def __init__(self, database_url: str, *words: str, yes: bool = True) -> None:
        argv = [*words, "--database-url", database_url, "--key-prefix", "sq"]
        if yes:
            argv.append("--yes")
        self._terminal, tty = pty.openpty()
        self.proc = subprocess.Popen(
            [*parent_death_prefix(), sys.executable, "-c", CLI, *argv],
            stdin=tty,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        os.close(tty)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read1(4096):
            self._chunks.append(chunk)

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    async def printed(self, text: str, timeout_s: float = 120) -> None:
        async def out() -> str:
            return self.output

        def shown(o: str) -> bool:
            assert text in o or self.proc.poll() is None, f"exited without {text!r}:\n{o}"
            return text in o

        await wait_for(out, shown, timeout_s=timeout_s, what=f"{text!r} in:\n{self.output}")

    def answer(self, line: str) -> None:
        os.write(self._terminal, f"{line}\n".encode())

    async def exit_code(self, timeout_s: float = 120) -> int:
        code = await asyncio.to_thread(self.proc.wait, timeout_s)
        await asyncio.to_thread(self._reader.join, 10)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        os.close(self._terminal)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@asynccontextmanager
async def background(database_url: str, *words: str, yes: bool = True) -> AsyncIterator[Background]:
    run = Background(database_url, *words, yes=yes)
    try:
        yield run
    finally:
        run.close()


async def connect(
    database_url: str, name: str = "shardq test"
) -> psycopg.AsyncConnection[TupleRow]:
    return await psycopg.AsyncConnection.connect(
        db.psycopg_dsn(database_url), autocommit=True, application_name=name
    )


async def waiting_on_a_lock(database_url: str, statement: str) -> None:
    """Until a session's ``statement`` (its first words) waits for a lock in Postgres."""
    async with await connect(database_url) as conn:

        async def waiting() -> int:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query ILIKE %s",
                (f"{statement}%",),
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        await wait_for(waiting, lambda n: n > 0, timeout_s=120, what=f"{statement} waiting")


@asynccontextmanager
async def move_row_locked(database_url: str, tenant: str) -> AsyncIterator[None]:
    """The move's row locked (FOR UPDATE) by a transaction of the test's, until the block ends:
    whoever reaches for the row meanwhile queues behind it, in the order they came."""
    async with await connect(database_url) as conn:
        await conn.set_autocommit(False)
        await conn.execute("SELECT 1 FROM shardq_moves WHERE tenant_id = %s FOR UPDATE", (tenant,))
        try:
            yield
        finally:
            await conn.commit()


def shard(cluster: Cluster, shard_id: int) -> ShardClient:
    return cluster.coordinator.pool.get(shard_id)[0]


async def jobs_of(cluster: Cluster, shard_id: int, tenant: str) -> int:
    """The tenant's scheduled, ready, active and dead jobs on the shard."""
    load = await shard(cluster, shard_id).tenant_load(tenant)
    return load.scheduled + load.ready + load.active + load.dead


# -- 1. `moves run` is fenced like the cluster's mover ----------------------------------------


async def test_moves_run_stops_moving_the_moment_its_lease_is_taken_from_it(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant, 1)
        # A worker of the test's holds the tenant's one job on the source: the move cannot
        # end, and its mover goes on taking what comes back to the source's queues.
        (held,) = await shard(cluster, 0).claim("test-worker", 1, 600_000)
        await submit(cluster, tenant, 20)  # before the move: on the source too
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err

        async with background(database_url, "moves", "run", "--active-wait-s", "600") as run:
            await run.printed("waiting for 1 active jobs")
            holder = await lease_holder(database_url)
            assert holder is not None and holder.name.startswith("shardq cli"), holder
            # Another mover takes the lease: queued for the lock, it holds it the moment the
            # command's session ends (as when Postgres drops a session whose host vanished).
            async with await connect(database_url, f"{APP_PREFIX} other mover") as other:
                queued = asyncio.create_task(
                    other.execute("SELECT pg_advisory_lock(%s)", (LEASE_KEY,))
                )
                await waiting_on_a_lock(database_url, "SELECT pg_advisory_lock")
                async with await connect(database_url) as admin:
                    await admin.execute("SELECT pg_terminate_backend(%s)", (holder.pid,))
                await queued

                # The command stopped its pass and only watches the new holder now.
                await run.printed("the mover lease was lost: stopped moving here")
                await run.printed("other mover holds the mover lease and runs the moves")
                # It neither finished the move nor gave up on it.
                assert tenant in (await load_map(database_url)).moves
                assert run.proc.poll() is None, run.output
                await shard(cluster, 0).ack([Lease(held.job_id, held.fence)])
                # The other mover lets go: the command takes the lease again and finishes.
                await other.execute("SELECT pg_advisory_unlock(%s)", (LEASE_KEY,))
            assert await run.exit_code() == 0, run.output
        assert "1 move done" in run.output, run.output
        assert (await load_map(database_url)).moves == {}
        assert (await jobs_of(cluster, 0, tenant), await jobs_of(cluster, 1, tenant)) == (0, 20)


# -- 2. a command acts on the moves it recorded, and only those ---------------------------------


async def test_a_move_another_command_made_meanwhile_leaves_its_moves_to_that_command(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant)
        async with background(database_url, "tenants", "move", tenant, "1", yes=False) as asks:
            await asks.printed("Go ahead? [y/N]")
            # Meanwhile another operator makes the same change, leaving its move pending.
            other = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
            assert other.code == 0, other.err
            move = (await load_map(database_url)).moves[tenant]
            asks.answer("y")
            assert await asks.exit_code() == 0, asks.output
        out = asks.output
        assert "nothing to change any more" in out, out
        assert f"1 other move in progress, not this command's ({tenant})" in out, out
        assert "moving 1 tenant here" not in out and "done" not in out, out
        assert (await load_map(database_url)).moves == {tenant: move}  # still the other's


async def test_an_unpin_another_command_made_meanwhile_leaves_its_moves_to_that_command(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant)
        pinned = await shardq(database_url, "tenants", "move", tenant, "1")
        assert pinned.code == 0 and (await load_map(database_url)).moves == {}, pinned
        async with background(database_url, "tenants", "unpin", tenant, yes=False) as asks:
            await asks.printed("Go ahead? [y/N]")
            other = await shardq(database_url, "tenants", "unpin", tenant, "--no-move")
            assert other.code == 0, other.err
            move = (await load_map(database_url)).moves[tenant]
            assert (move.from_shard_id, move.to_shard_id) == (1, 0)
            asks.answer("y")
            assert await asks.exit_code() == 0, asks.output
        out = asks.output
        assert "nothing to change any more" in out, out
        assert f"1 other move in progress, not this command's ({tenant})" in out, out
        assert "moving 1 tenant here" not in out and "done" not in out, out
        assert (await load_map(database_url)).moves == {tenant: move}


# -- 3. a finished move's mark goes on time, not at the end of the pass -------------------------


async def test_a_finished_move_is_unmarked_while_the_pass_still_waits_for_another(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        quick, slow = tenants_on(cluster, 0, 2)
        await submit(cluster, slow, 1)
        (held,) = await shard(cluster, 0).claim("test-worker", 1, 600_000)  # slow's only job
        await submit(cluster, quick)
        for t in (quick, slow):
            recorded = await shardq(database_url, "tenants", "move", t, "1", "--no-move")
            assert recorded.code == 0, recorded.err

        async with background(database_url, "moves", "run", "--active-wait-s", "600") as run:
            # Queued jobs have no dedupe key at a first install's job format: their hashes are
            # the records.
            await run.printed(f"{quick}: shard 0 -> 1: 20 jobs, 0 dedupe keys, 0 schedules; done")

            async def marks() -> list[str]:
                return sorted((await load_map(database_url)).moves)

            # The pass goes on (slow's job is held), yet quick's mark is dropped within
            # finish_every_s (5 s): no command or dashboard shows it in progress for 600 s.
            await wait_for(marks, lambda m: m == [slow], timeout_s=60, what="quick's mark gone")
            assert run.proc.poll() is None and (await jobs_of(cluster, 0, slow)) == 1
            await shard(cluster, 0).ack([Lease(held.job_id, held.fence)])
            assert await run.exit_code() == 0, run.output
        assert (await load_map(database_url)).moves == {}


# -- 6. `moves abort` and a mover's first take serialize on the move's row ---------------------


async def test_an_abort_that_reaches_the_move_first_wins_and_the_mover_takes_nothing(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant)
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err
        async with AsyncExitStack() as stack:
            async with move_row_locked(database_url, tenant):
                abort = await stack.enter_async_context(
                    background(database_url, "moves", "abort", tenant)
                )
                await waiting_on_a_lock(database_url, "DELETE FROM shardq_moves")
                mover = await stack.enter_async_context(
                    background(database_url, "moves", "run", tenant)
                )
                await waiting_on_a_lock(database_url, "UPDATE shardq_moves")
            # The row is free: the abort, queued first, deletes it; then the mover finds none.
            assert await abort.exit_code() == 0, abort.output
            assert await mover.exit_code() == 0, mover.output
        assert "1 move aborted meanwhile" in mover.output, mover.output
        smap = await load_map(database_url)
        assert smap.moves == {} and smap.shard_for(tenant) == 0
        # Every job where the map sends the tenant again, none on the abandoned target.
        assert (await jobs_of(cluster, 0, tenant), await jobs_of(cluster, 1, tenant)) == (20, 0)
        assert tenant not in await shard(cluster, 1).tenants()


async def test_a_mover_that_reaches_the_move_first_wins_and_the_abort_is_refused(
    database_url: str,
) -> None:
    async with running_cluster(database_url) as cluster:
        (tenant,) = tenants_on(cluster, 0, 1)
        await submit(cluster, tenant)
        recorded = await shardq(database_url, "tenants", "move", tenant, "1", "--no-move")
        assert recorded.code == 0, recorded.err
        async with AsyncExitStack() as stack:
            async with move_row_locked(database_url, tenant):
                mover = await stack.enter_async_context(
                    background(database_url, "moves", "run", tenant)
                )
                await waiting_on_a_lock(database_url, "UPDATE shardq_moves")
                # The abort finds nothing taken yet (the mover waits) and queues second.
                abort = await stack.enter_async_context(
                    background(database_url, "moves", "abort", tenant)
                )
                await waiting_on_a_lock(database_url, "DELETE FROM shardq_moves")
            # The row is free: the mover, queued first, marks it copying; the abort sees that.
            assert await abort.exit_code() == 1, abort.output
            assert await mover.exit_code() == 0, mover.output
        assert f"copying has started for tenants {tenant}" in abort.output, abort.output
        assert "1 move done" in mover.output, mover.output
        smap = await load_map(database_url)
        assert smap.moves == {} and smap.shard_for(tenant) == 1
        assert (await jobs_of(cluster, 0, tenant), await jobs_of(cluster, 1, tenant)) == (0, 20)
