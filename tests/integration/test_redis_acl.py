"""Redis ACL users per role (``shardq shards acl``, shard/acl.py) on a real Redis: made by the
real CLI, the default user turned off, a worker user that can do its work and nothing that
admits, configures or deletes, and a whole cluster — a coordinator, a shard loop and a worker
process, each logged in as its own user — taking jobs down every path a worker's scripts have
(success, retry, dead letter, delayed, cancel, progress, pause, active cap, a killed worker's
lease reaped, a drain), with no NOPERM anywhere."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, ResponseError

from shardq.client import AsyncClient, JobState, RetryPolicy, TenantLimits
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.shard.client import ShardClient
from shardq.shard.models import NewJob, ShardSettings
from shardq.shard.records import derived_job_id
from tests.integration.test_frontdoor_metrics import tokens
from tests.support.coordinator_proc import (
    coordinator_process,
    one_shard,
    prepare_database,
    wait_for,
)
from tests.support.workers import result_rows

PREFIX = "sq"
PASSWORDS = {"worker": "pw-w", "loop": "pw-l", "coordinator": "pw-c", "admin": "pw-a"}
# The shardq of this interpreter (a fresh machine has no venv on PATH).
SHARDQ = str(Path(sys.executable).parent / "shardq")
#: How Redis refuses a command (NOPERM) or a script's key or command (its own words) to a user.
REFUSED = "(?i)NOPERM|no permissions|can't access|can't run this command"


def make_users(database_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SHARDQ_DATABASE_URL": database_url,
        "SHARDQ_KEY_PREFIX": PREFIX,
        **{f"SHARDQ_REDIS_PASSWORD_{r.upper()}": pw for r, pw in PASSWORDS.items()},
    }
    return subprocess.run(
        [SHARDQ, "shards", "acl", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def as_user(shard: RedisProcess, role: str) -> Redis:
    return Redis(port=shard.port, username=f"{PREFIX}-{role}", password=PASSWORDS[role])


async def test_the_worker_user_does_its_work_and_nothing_else(database_url: str) -> None:
    async with one_shard(database_url) as (shard, _):
        done = make_users(database_url, "--disable-default")
        assert done.returncode == 0, done.stderr
        assert "sq-worker, sq-loop, sq-coordinator, sq-admin; default user off" in done.stdout

        async with Redis(port=shard.port) as nobody:
            with pytest.raises((AuthenticationError, ResponseError)):
                await nobody.ping()

        settings = ShardSettings(key_prefix=PREFIX)
        job = NewJob(tenant="acme", handler="h", payload=b"{}", request_id="r1")
        async with as_user(shard, "worker") as worker:
            as_worker = ShardClient(worker, settings)
            assert await as_worker.claim("w1", 10, 30_000) == []  # its own work: allowed
            with pytest.raises(ResponseError, match=REFUSED):
                await as_worker.enqueue([job])  # admitting a job is the coordinator's
            for command in (
                ("HSET", f"{PREFIX}:limits:acme", "max_active", "1000"),  # raise its limits
                ("SADD", f"{PREFIX}:paused", "rival"),  # pause another tenant
                ("HSET", f"{PREFIX}:bucket:acme", "tokens", "1000"),  # fill its rate bucket
                ("SADD", f"{PREFIX}:tenants", "acme"),
                ("SET", f"{PREFIX}:leader", "me"),  # take the loop's lease
                ("HSET", f"{PREFIX}:schedules:acme", "s", "x"),
                ("SET", f"{PREFIX}:identity", "9"),
                ("SET", "elsewhere", "1"),  # outside the prefix
                ("FLUSHALL",),
                ("KEYS", "*"),
                ("CONFIG", "SET", "appendonly", "no"),
                ("ACL", "SETUSER", "default", "on"),
                ("SCRIPT", "FLUSH"),
            ):
                with pytest.raises(ResponseError, match=REFUSED):
                    await worker.execute_command(*command)
            # Lua it sends itself runs with its own rights, not the server's.
            with pytest.raises(ResponseError, match=REFUSED):
                await worker.eval(f"return redis.call('SET', '{PREFIX}:leader', 'me')", 0)
            assert int(await worker.hget(f"{PREFIX}:limits:acme", "max_active") or 0) == 0

        # The coordinator's user admits, but administers nothing.
        async with as_user(shard, "coordinator") as coordinator:
            assert (await ShardClient(coordinator, settings).enqueue([job]))[0].job_id
            for command in (("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("KEYS", "*")):
                with pytest.raises(ResponseError, match=REFUSED):
                    await coordinator.execute_command(*command)

        # Running it again replaces the users (with the admin: default is off now).
        again = make_users(database_url, "--redis-username", "sq-admin", "--redis-password", "pw-a")
        assert again.returncode == 0, again.stderr


def test_shards_acl_refuses_to_lock_everyone_out(database_url: str) -> None:
    env = {**os.environ, "SHARDQ_DATABASE_URL": database_url, "SHARDQ_REDIS_PASSWORD_WORKER": "w"}
    done = subprocess.run(
        [SHARDQ, "shards", "acl", "--disable-default"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--disable-default needs SHARDQ_REDIS_PASSWORD_ADMIN" in done.stderr


async def test_a_cluster_runs_every_worker_path_with_a_user_per_process(  # noqa: PLR0915
    database_url: str, tmp_path: Path
) -> None:
    shard = RedisProcess().start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        admin_token = await prepare_database(database_url, [shard])
        (acme_token,) = await tokens(database_url, "acme")
        done = make_users(database_url, "--disable-default")
        assert done.returncode == 0, done.stderr
        common = {**os.environ, "SHARDQ_KEY_PREFIX": PREFIX, "SHARDQ_LOG_LEVEL": "INFO"}

        def spawn(name: str, module: str, role: str, **env: str) -> None:
            with (logs / f"{name}.log").open("ab") as out:
                procs[name] = subprocess.Popen(
                    [*parent_death_prefix(), sys.executable, "-m", module],
                    env={
                        **common,
                        "SHARDQ_REDIS_USERNAME": f"{PREFIX}-{role}",
                        "SHARDQ_REDIS_PASSWORD": PASSWORDS[role],
                        "SHARDQ_METRICS_PORT": str(free_port()),
                        **env,
                    },
                    stderr=out,
                )

        async with coordinator_process(
            database_url,
            admin_token,
            key_prefix=PREFIX,
            redis_username=f"{PREFIX}-coordinator",
            redis_password=PASSWORDS["coordinator"],
        ) as coordinator:
            spawn(
                "loop",
                "shardq.shard",
                "loop",
                SHARDQ_REDIS_URL=shard.url,
                SHARDQ_SHARD_ID="0",
                SHARDQ_DATABASE_URL=database_url,
                SHARDQ_REAP_INTERVAL_MS="100",
            )
            worker_env = {
                "SHARDQ_HANDLERS": "tests.support.handlers,tests.support.handlers_progress",
                "SHARDQ_COORDINATOR": coordinator.target,
                "SHARDQ_WORKER_TOKEN": admin_token,
                "SHARDQ_DATABASE_URL": database_url,
                "SHARDQ_LEASE_MS": "1000",
                "SHARDQ_DRAIN_GRACE_S": "1",
            }
            spawn("worker-1", "shardq.worker", "worker", **worker_env)
            retry = RetryPolicy(attempts=3)
            async with (
                AsyncClient(coordinator.target, acme_token, retry=retry) as acme,
                AsyncClient(coordinator.target, admin_token, retry=retry) as admin,
            ):
                gate = tmp_path / "gates"
                gate.mkdir()
                jobs: dict[str, Any] = {
                    "ok": await acme.submit("test.work", {"n": 1}, request_id="ok"),
                    "retry": await acme.submit("test.retry_later", {}, request_id="retry"),
                    "dead": await acme.submit("test.permanent", {}, request_id="dead"),
                    "delayed": await acme.submit("test.work", {}, request_id="delayed", delay=1),
                    "progress": await acme.submit(
                        "progress.sync", {"dir": str(gate)}, request_id="progress"
                    ),
                }
                later = await acme.submit("test.work", {}, request_id="cancelled", delay=3600)
                await acme.cancel(later.job_id)
                await wait_for(
                    lambda: acme.get(jobs["progress"].job_id),
                    lambda j: j.progress is not None and j.progress.fraction == 0.5,
                    what="the progress report (a heartbeat)",
                )
                (gate / "go").touch()
                for name, sub in jobs.items():
                    end = await acme.wait(sub.job_id, timeout=60)
                    assert end.state is (JobState.DEAD if name == "dead" else JobState.SUCCEEDED)

                # Paused: the worker reads the pause and leaves the job; resumed, it runs.
                await admin.pause("acme")
                paused = await acme.submit("test.work", {}, request_id="paused")
                await asyncio.sleep(1.0)
                assert (await acme.get(paused.job_id)).state is JobState.READY
                await admin.resume("acme")
                assert (await acme.wait(paused.job_id, timeout=30)).state is JobState.SUCCEEDED

                # An active cap of 1: claims park the tenant and unpark it as jobs end.
                await admin.set_tenant_limits(TenantLimits(max_active=1), "acme")
                capped = [
                    await acme.submit("test.work", {"ms": 200}, request_id=f"cap{i}")
                    for i in range(3)
                ]
                for sub in capped:
                    assert (await acme.wait(sub.job_id, timeout=30)).state is JobState.SUCCEEDED
                await admin.set_tenant_limits(TenantLimits(), "acme")

                # A worker killed mid-job: the loop reaps the lease and dead-letters the job.
                stuck = await acme.submit(
                    "test.work", {"ms": 60_000}, request_id="stuck", max_attempts=1
                )
                await wait_for(
                    lambda: acme.get(stuck.job_id),
                    lambda j: j.state is JobState.ACTIVE,
                    what="the long job to start",
                )
                procs["worker-1"].kill()
                procs["worker-1"].wait()
                assert (await acme.wait(stuck.job_id, timeout=30)).state is JobState.DEAD

                # A drain hands a running job back (release) and another worker runs it.
                spawn("worker-2", "shardq.worker", "worker", **worker_env)
                drained = await acme.submit("test.work", {"ms": 3_000}, request_id="drained")
                await wait_for(
                    lambda: acme.get(drained.job_id),
                    lambda j: j.state is JobState.ACTIVE,
                    what="the drained job to start",
                )
                procs["worker-2"].send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(procs["worker-2"].wait, 30) == 0
                spawn("worker-3", "shardq.worker", "worker", **worker_env)
                assert (await acme.wait(drained.job_id, timeout=60)).state is JobState.SUCCEEDED

            rows = await wait_for(
                lambda: result_rows(database_url),
                lambda rows: len(rows) >= 12,
                timeout_s=60,
                what="every result row",
            )
            statuses = {r["request_id"]: r["status"] for r in rows}
            assert statuses["cancelled"] == "cancelled"  # written by the loop
            assert statuses["stuck"] == "dead"  # reaped by the loop
            assert statuses["dead"] == "dead"
            # At a first install's job format, the worker's own scripts wrote these keys as
            # they ended the jobs (ack, fail).
            assert jobs["ok"].job_id == derived_job_id("acme", "ok")
            async with as_user(shard, "admin") as admin_redis:
                for rid in ("ok", "dead", "drained"):
                    assert await admin_redis.exists(f"{PREFIX}:dedupe:acme:{rid}"), rid
            for name in ("loop", "worker-3"):
                assert procs[name].poll() is None, f"{name} exited: {procs[name].returncode}"
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(30)
        shard.cleanup()
    for log in logs.iterdir():
        text = log.read_text()
        assert not re.search(REFUSED, text), f"{log.name}: {text[-2000:]}"


async def test_the_users_conf_a_redis_includes_at_start_holds_the_same_users(
    tmp_path: Path,
) -> None:
    """``shardq shards acl-conf`` (what the chart's shard pods include): a Redis started with
    it has the users, their passwords kept only as hashes."""
    env = {
        **os.environ,
        "SHARDQ_KEY_PREFIX": PREFIX,
        **{f"SHARDQ_REDIS_PASSWORD_{r.upper()}": pw for r, pw in PASSWORDS.items()},
    }
    done = await asyncio.to_thread(
        subprocess.run,
        [SHARDQ, "shards", "acl-conf"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert not any(pw in done.stdout for pw in PASSWORDS.values())
    conf = tmp_path / "users.conf"
    conf.write_text(done.stdout)
    shard = RedisProcess(extra_args=["--include", str(conf)]).start()
    try:
        settings = ShardSettings(key_prefix=PREFIX)
        job = NewJob(tenant="acme", handler="h", payload=b"{}", request_id="r1")
        async with as_user(shard, "coordinator") as coordinator:
            assert (await ShardClient(coordinator, settings).enqueue([job]))[0].job_id
        async with as_user(shard, "worker") as worker:
            with pytest.raises(ResponseError, match=REFUSED):
                await ShardClient(worker, settings).enqueue([job])
            assert await ShardClient(worker, settings).claim("w1", 10, 30_000)
    finally:
        shard.cleanup()
