"""The dashboard's own cost on a big cluster: seed TENANTS tenants and JOBS ready jobs, then
time the overview and the tenants pages as a logged-in admin sees them (HTTP through a real
``shardq dashboard`` process, against a real coordinator and Redis shards).

    .venv/bin/python bench/dashboard.py                       # 1,000 tenants, 200,000 jobs
    .venv/bin/python bench/dashboard.py --jobs 1000000 --runs 7

Seeding goes through the API's batch call (``SubmitJobs``, BATCH jobs a call, CONCURRENCY
calls in flight): the same path a service takes, no shortcut into Redis. Prints the seeding
rate and, per page, the wall time of each GET as min / median / max (quote medians), and
one JSON line with them all.
"""

from __future__ import annotations

import argparse
import asyncio
import http.cookiejar
import json
import re
import statistics
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardq.v1 import common_pb2, jobs_pb2
from tests.dashboard.support import DashboardProcess
from tests.support.cluster import running_cluster
from tests.support.postgres import sqlalchemy_url, throwaway_database

BATCH = 500
CONCURRENCY = 8


async def seed(cluster: object, tenants: int, jobs: int) -> float:
    """Submit ``jobs`` jobs spread over ``tenants`` tenants; returns the seconds it took."""
    admin = await cluster.client()  # type: ignore[attr-defined]
    per_tenant = max(1, jobs // tenants)
    batches: list[tuple[str, int, int]] = []
    for t in range(tenants):
        n = per_tenant if t < tenants - 1 else jobs - per_tenant * (tenants - 1)
        for start in range(0, n, BATCH):
            batches.append((f"tenant-{t:04d}", start, min(BATCH, n - start)))
    queue: asyncio.Queue[tuple[str, int, int]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)

    async def submitter() -> None:
        while not queue.empty():
            tenant, start, count = queue.get_nowait()
            specs = [
                common_pb2.JobSpec(
                    request_id=f"{tenant}-{start + i}", handler="bench.noop", payload=b"{}"
                )
                for i in range(count)
            ]
            req = jobs_pb2.SubmitJobsRequest(tenant_id=tenant, jobs=specs)
            await admin.stubs.jobs.SubmitJobs(req, metadata=admin.metadata, timeout=120)

    started = time.perf_counter()
    await asyncio.gather(*(submitter() for _ in range(CONCURRENCY)))
    return time.perf_counter() - started


def session(url: str, token: str) -> urllib.request.OpenerDirector:
    """An HTTP client logged in to the dashboard (its cookies kept)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    page = opener.open(f"{url}/login").read().decode()
    nonce = re.search(r'name="nonce" value="([^"]+)"', page)
    assert nonce, page
    form = urllib.parse.urlencode({"nonce": nonce.group(1), "token": token}).encode()
    opener.open(f"{url}/login", data=form).read()
    return opener


def timed_get(opener: urllib.request.OpenerDirector, url: str) -> float:
    started = time.perf_counter()
    with opener.open(url) as r:
        r.read()
        assert r.status == 200, r.status
    return time.perf_counter() - started


async def main(args: argparse.Namespace) -> dict[str, object]:
    with throwaway_database() as db:
        async with running_cluster(sqlalchemy_url(db), shard_count=args.shards) as cluster:
            seconds = await seed(cluster, args.tenants, args.jobs)
            print(
                f"seeded {args.jobs:,} jobs over {args.tenants:,} tenants in {seconds:.1f} s "
                f"({args.jobs / seconds:,.0f} jobs/s)",
                flush=True,
            )
            dash = DashboardProcess(cluster.target)
            try:
                url = await asyncio.to_thread(dash.wait_ready)
                opener = await asyncio.to_thread(session, url, cluster.admin_token)
                pages = {
                    "overview": f"{url}/",
                    "overview (live part)": f"{url}/overview/shards",
                    "tenants (sorted by completed)": f"{url}/tenants?sort=completed_total&dir=desc",
                    "tenant page": f"{url}/tenants/tenant-0007",
                }
                out: dict[str, object] = {
                    "tenants": args.tenants,
                    "jobs": args.jobs,
                    "shards": args.shards,
                    "seed_jobs_per_s": round(args.jobs / seconds),
                }
                for name, page in pages.items():
                    await asyncio.to_thread(timed_get, opener, page)  # warm
                    times = [
                        await asyncio.to_thread(timed_get, opener, page) for _ in range(args.runs)
                    ]
                    print(
                        f"{name:32s} min {min(times):.3f} s  median "
                        f"{statistics.median(times):.3f} s  max {max(times):.3f} s",
                        flush=True,
                    )
                    out[name] = round(statistics.median(times), 4)
                return out
            finally:
                dash.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
