"""The control side under faults: a shard loop leader killed with a standby beside it, the
coordinator the clients talk to killed while they submit, and fifty concurrent submits of one
request_id through two coordinators; each ends with the reconciliation (printed with ``-s``)."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

import pytest

from shardq.client import AsyncClient, Submitted
from shardq.coordinator.tools.reconcile import Accepted
from shardq.coordinator.tools.soak import JobArgs
from tests.support.chaos import (
    Chaos,
    CoordinatorProcess,
    LoopProcess,
    chaos_of,
    create_ledger,
    ledger_jobs,
    load_on,
    start_loop,
    wait_for_leaders,
)
from tests.support.cluster import running_cluster
from tests.support.procs import wait_until_serving

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(300)]


async def test_shard_loop_leaders_killed_under_load_hand_over_to_their_standbys(
    database_url: str, tmp_path: Path
) -> None:
    await create_ledger(database_url)
    loops: list[LoopProcess] = []
    async with running_cluster(database_url) as cluster:  # no in-process loops: processes
        chaos = chaos_of(cluster, tmp_path)
        try:
            for i in range(len(cluster.shards)):
                loops += [start_loop(cluster, i, f"loop-{i}{r}", database_url) for r in "ab"]
            leaders = [await wait_for_leaders(loops[2 * i : 2 * i + 2]) for i in range(2)]
            for _ in range(2):
                chaos.start_worker()
            for w in chaos.workers:
                await wait_until_serving(w, timeout_s=90)
            rng = random.Random(31)
            mortal: set[str] = set()

            def job(n: int) -> JobArgs:
                # Delayed jobs need a leader to promote them; jobs of one attempt whose worker
                # is killed need one to reap them and write their dead rows.
                rid = f"lp-{n}"
                payload = {"n": n, "ms": rng.randint(20, 100)}
                if n % 5 == 0:
                    mortal.add(rid)
                    payload["ms"] = 3_000
                    return "chaos.ledger", payload, {"request_id": rid, "max_attempts": 1}
                delay = rng.randint(200, 2_000) / 1000
                return "chaos.ledger", payload, {"request_id": rid, "delay": delay}

            load = load_on(cluster.target, cluster.admin_token, job, rate=30)
            await load.until_accepted(60)
            for leader in leaders:
                leader.proc.kill()  # kill -9: its lease is left to run out
                await asyncio.to_thread(leader.proc.wait, 10)
            chaos.workers[0].proc.kill()  # its one-attempt jobs are the new leaders' to reap
            chaos.start_worker()
            standbys = [
                await wait_for_leaders([lp for lp in loops[2 * i : 2 * i + 2] if lp not in leaders])
                for i in range(2)
            ]
            await asyncio.sleep(3)
            accepted = await load.stop()
            report = await chaos.reconcile(
                accepted, faults_ended_at=time.monotonic(), may_die=lambda k: k[1] in mortal
            )
        finally:
            chaos.stop_workers()
            for lp in loops:
                lp.stop()
    assert report.ok, report.render()
    assert all(s not in leaders for s in standbys)
    assert report.by_status.get("dead", 0) > 0, "the killed worker held no one-attempt job"


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


async def test_a_coordinator_killed_while_clients_submit_is_ridden_out_with_no_duplicate(
    chaos: Chaos,
) -> None:
    # The clients' coordinator is a process of its own (the workers follow the in-process one).
    front = CoordinatorProcess(chaos.cluster.database_url).start()
    try:
        async with asyncio.timeout(60):
            while not listening(front.port):
                await asyncio.sleep(0.1)
        for _ in range(2):
            chaos.start_worker()
        for w in chaos.workers:
            await wait_until_serving(w, timeout_s=90)
        rng = random.Random(32)
        # The client's default RetryPolicy: every submit must get through the restart.
        load = load_on(front.target, chaos.cluster.admin_token, ledger_jobs("co", rng))
        await load.until_accepted(80)
        front.kill()
        killed_at = len(load.accepted)
        await asyncio.sleep(2)
        front.start()  # the same port
        await load.until_accepted(killed_at + 80, timeout_s=120)
        accepted = await load.stop()
        report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    finally:
        front.stop()
    assert report.ok, report.render()
    assert load.load.refused == {}, load.load.refused


async def test_fifty_concurrent_submits_of_one_request_id_make_one_job_one_row_one_run(
    chaos: Chaos,
) -> None:
    cluster = chaos.cluster
    w = chaos.start_worker()
    await wait_until_serving(w, timeout_s=90)
    token = await cluster.token_for("acme")
    async with cluster.replica() as replica:
        clients = [AsyncClient(cluster.target, token), AsyncClient(replica.target, token)]
        try:
            answers: list[Submitted] = await asyncio.gather(
                *(
                    clients[i % 2].submit("chaos.ledger", {"ms": 50}, request_id="same")
                    for i in range(50)
                )
            )
        finally:
            await asyncio.gather(*(c.close() for c in clients))
        accepted = Accepted()
        for a in answers:
            accepted.add("acme", "same", a.job_id)  # two job IDs would be a duplicate job
        report = await chaos.reconcile(accepted, faults_ended_at=time.monotonic())
    assert report.ok, report.render()
    assert sum(not a.deduplicated for a in answers) == 1
    assert (report.executions, report.by_status) == (1, {"succeeded": 1})
