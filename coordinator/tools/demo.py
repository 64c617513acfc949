"""``shardq demo``: a mixed workload for a running cluster (``shardq dev``), so its live view
shows the whole lifecycle of jobs.

With the admin token it acts for several tenants (``--tenants``) and submits, per tenant:
``echo`` jobs at every priority, ``sleep`` jobs, delayed jobs (2 to 20 s), ``ledger.add``
writes, a ``flaky`` job that fails twice and then succeeds on its third attempt, a ``fail``
job that ends in the dead-letter set after 3 attempts, and a recurring schedule
(``demo-every-minute``, an ``echo`` each minute). It needs the example handlers
(``shardq.worker.examples``), which ``shardq dev`` runs by default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import grpc

from shardq.client import AsyncClient, JobRequest, RetryPolicy
from shardq.common import config, tls
from shardq.common.errors import Unauthenticated
from shardq.coordinator.cli.terminal import plural
from shardq.coordinator.tools.data_dir import dev_env_file, read_tokens, tokens_path

DEFAULT_TENANTS = "acme,globex,initech"
SCHEDULE_ID = "demo-every-minute"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``shardq demo``'s own arguments (the CLI adds the API connection options)."""
    parser.add_argument(
        "--tenants",
        default=DEFAULT_TENANTS,
        help=f"comma-separated tenants (default {DEFAULT_TENANTS})",
    )
    parser.add_argument(
        "--scale", type=int, default=1, help="multiply the number of jobs (default 1)"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until every job submitted has finished, then print a summary",
    )
    parser.add_argument(
        "--data-dir",
        default=str(dev_env_file().parent),
        help="without --token: use the admin token `shardq dev` stored here",
    )


def workload(scale: int = 1, rng: random.Random | None = None) -> list[JobRequest]:
    """One tenant's jobs: every handler of shardq.worker.examples, priorities, delays, failures."""
    rng = rng or random.Random()
    specs = []
    for i in range(20 * scale):
        specs.append(JobRequest("echo", {"n": i}, priority=i % 10))
    for _ in range(8 * scale):
        ms, priority = rng.randint(100, 1500), rng.randint(0, 9)
        specs.append(JobRequest("sleep", {"ms": ms}, priority=priority))
    for i in range(8 * scale):
        delay = timedelta(milliseconds=rng.randint(2_000, 20_000))
        specs.append(JobRequest("echo", {"delayed": i}, delay=delay))
    for i in range(4 * scale):
        specs.append(
            JobRequest("ledger.add", {"account": f"acct-{i % 3}", "amount": rng.randint(1, 100)})
        )
    specs.append(JobRequest("flaky", {"fail_times": 2}, max_attempts=5))
    specs.append(JobRequest("fail", {"why": "a demo dead letter"}, max_attempts=3))
    return specs


@dataclass
class DemoResult:
    submitted: dict[str, int] = field(default_factory=dict)
    #: job IDs per tenant (to wait for them)
    job_ids: dict[str, list[str]] = field(default_factory=dict)
    final: dict[str, int] = field(default_factory=dict)


async def run_demo(
    target: str,
    admin_token: str,
    *,
    tenants: list[str] | None = None,
    scale: int = 1,
    wait: bool = False,
    say: Callable[[str], None] = print,
    **client_options: Any,
) -> DemoResult:
    """Submit the workload for each tenant; ``client_options`` go to AsyncClient (TLS)."""
    result = DemoResult()
    for tenant in tenants or DEFAULT_TENANTS.split(","):
        async with AsyncClient(
            target, admin_token, tenant_id=tenant, retry=RetryPolicy(attempts=4), **client_options
        ) as client:
            items = await client.submit_many(workload(scale))
            ids = [it.job_id for it in items if it.job_id]
            errors = [it.error.message for it in items if it.error]
            if errors:
                say(f"demo: {tenant}: {plural(len(errors), 'job')} refused, e.g. {errors[0]}")
            await client.schedule(SCHEDULE_ID, "* * * * *", "echo", {"from": SCHEDULE_ID})
        result.submitted[tenant] = len(ids)
        result.job_ids[tenant] = ids
        say(
            f"demo: {tenant}: submitted {plural(len(ids), 'job')} (priorities 0-9, delays up "
            f"to 20 s, a flaky job, a dead letter) and schedule {SCHEDULE_ID}"
        )
    if wait:
        await _wait_all(target, admin_token, result, client_options)
        summary = ", ".join(f"{k} {v}" for k, v in sorted(result.final.items()))
        say(f"demo: all {plural(sum(result.submitted.values()), 'job')} finished: {summary}")
    return result


async def _wait_all(
    target: str, admin_token: str, result: DemoResult, client_options: dict[str, Any]
) -> None:
    for tenant, ids in result.job_ids.items():
        async with AsyncClient(target, admin_token, tenant_id=tenant, **client_options) as client:
            pending = set(ids)
            while pending:
                jobs = await asyncio.gather(*(client.get(j) for j in sorted(pending)))
                for job in jobs:
                    if job.done:
                        pending.discard(job.job_id)
                        name = job.state.name.lower()
                        result.final[name] = result.final.get(name, 0) + 1
                if pending:
                    await asyncio.sleep(0.5)


def admin_token_from(data_dir: str) -> str:
    """The admin token ``shardq dev`` stored in ``data_dir``."""
    path = tokens_path(data_dir)
    token = read_tokens(path).admin
    if not token:
        raise Unauthenticated(
            f"no token: pass --token ADMIN_TOKEN (or SHARDQ_TOKEN); {path} has none"
        )
    return token


def _from_dev_env_file(token: str) -> bool:
    return not os.environ.get("SHARDQ_TOKEN") and token == config.env_file_value("SHARDQ_TOKEN")


def run(args: argparse.Namespace) -> Awaitable[int]:
    """``shardq demo``: reads the token and TLS files here, submits in the coroutine it
    returns."""
    token = args.token
    if not token or _from_dev_env_file(token):
        # The env file's SHARDQ_TOKEN is a tenant's; the demo submits for several tenants.
        token = admin_token_from(args.data_dir)
    if args.scale < 1:
        raise ValueError("--scale must be at least 1")
    return _run(args, token, **tls.api_client_options(args))


async def _run(args: argparse.Namespace, token: str, **client_options: Any) -> int:
    tenants = [t.strip() for t in args.tenants.split(",") if t.strip()]
    try:
        result = await run_demo(
            args.coordinator,
            token,
            tenants=tenants,
            scale=args.scale,
            wait=args.wait,
            say=(lambda _text: None) if args.json else print,
            **client_options,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            raise Unauthenticated(
                f"{exc.details()} (shardq demo acts for several tenants: give the admin token)"
            ) from exc
        raise
    if args.json:
        print(json.dumps({"submitted": result.submitted, "final": result.final}, indent=2))
    return 0
