"""Does an open dashboard slow the cluster down? The drain scenario of ``bench/run.py``
(``bench/shardq_bench.py``: N no-op jobs queued, then 2 workers drain them; the rate runs from
the first start to the last result row in Postgres), run without the dashboard and with a
``shardq-dashboard`` process and an overview page open on it, in turns, each on a fresh cluster.

    .venv/bin/python bench/dashboard_drain.py                    # 20,000 jobs, 1 round
    .venv/bin/python bench/dashboard_drain.py --n 20000 --rounds 3

The open page is what the overview asks for while it is open: the page itself once, then its
live table (``/overview/shards``, every 3 s) and its charts' data (``/overview/series.json``,
every 5 s), by HTTP from this process, logged in with an admin token (which also starts the
dashboard's sampler: one ``ListShardStatus`` every 5 s). No browser: the browser runs on the
operator's machine, not the cluster's, and its rendering is not the cluster's load.

Prints each drain's rate and the ratio with/without per round, then one JSON line.
"""

from __future__ import annotations

import argparse
import http.cookiejar
import json
import re
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import shardq_bench as sb  # noqa: E402
from services import PostgresServer, RedisServer  # noqa: E402

from shardq.coordinator.tools.redis_server import free_port  # noqa: E402

#: How often the overview page asks for its live parts (templates/overview.html, charts.js).
TABLE_EVERY_S = 3.0
CHARTS_EVERY_S = 5.0


class OpenOverview:
    """The requests of an overview page left open, in a thread, until stopped."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        page = self.opener.open(f"{url}/login").read().decode()
        nonce = re.search(r'name="nonce" value="([^"]+)"', page)
        assert nonce, page
        form = urllib.parse.urlencode({"nonce": nonce.group(1), "token": token}).encode()
        landed = self.opener.open(f"{url}/login", data=form)
        assert landed.geturl().rstrip("/") == url, landed.geturl()  # the overview: admin
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _get(self, path: str) -> None:
        with self.opener.open(f"{self.url}{path}", timeout=30) as r:
            r.read()
            assert r.status == 200, (path, r.status)
        self.requests += 1

    def _run(self) -> None:
        started = time.monotonic()
        next_table, next_charts = started + TABLE_EVERY_S, started
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_charts:
                self._get("/overview/series.json")
                next_charts += CHARTS_EVERY_S
            if now >= next_table:
                self._get("/overview/shards")
                next_table += TABLE_EVERY_S
            self._stop.wait(max(0.0, min(next_table, next_charts) - time.monotonic()))

    def __enter__(self) -> OpenOverview:
        self._get("/")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def start_dashboard(cluster: sb.Cluster) -> str:
    """``shardq-dashboard`` next to the cluster, as the chart runs it; returns its URL."""
    port = free_port()
    env = {
        **cluster._common(),
        "SHARDQ_COORDINATOR": cluster.target,
        "SHARDQ_DASHBOARD_LISTEN": f"127.0.0.1:{port}",
    }
    cluster.spawn("dashboard", [str(sb.BIN / "shardq-dashboard")], env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        cluster.check_alive()
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the dashboard did not start in 60 s")
        time.sleep(0.05)


def one_drain(base: dict[str, Any], n: int, with_dashboard: bool) -> dict[str, Any]:
    req = {**base, "workdir": tempfile.mkdtemp(prefix="dash-drain-", dir=base["tmp"])}
    with sb.Cluster(req, req["redis_urls"][:1], ["bench"]) as cluster:
        try:
            if not with_dashboard:
                return {**sb._drain_run(cluster, {"bench": range(n)}, 1000, 900), "requests": 0}
            env = sb._env({"SHARDQ_DATABASE_URL": cluster.database_url})
            token = json.loads(sb._cli("tokens", "create", "--admin", "--json", env=env))["token"]
            url = start_dashboard(cluster)
            with OpenOverview(url, token) as page:
                metrics = sb._drain_run(cluster, {"bench": range(n)}, 1000, 900)
            return {**metrics, "requests": page.requests}
        finally:
            cluster.stop(("dashboard",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000, help="jobs per drain (run.py: 20,000)")
    parser.add_argument("--rounds", type=int, default=1, help="without/with pairs, in turns")
    args = parser.parse_args()
    out: dict[str, Any] = {"n": args.n, "rounds": []}
    with (
        tempfile.TemporaryDirectory(prefix="shardq-dash-drain-") as tmp,
        RedisServer() as redis,
        PostgresServer() as postgres,
    ):
        base = {
            "op": "run",
            "scenario": "drain",
            "params": {"n": args.n},
            "redis_url": redis.url,
            "redis_urls": [redis.url],
            "postgres_url": postgres.url,
            "tmp": tmp,
            "repeat": 0,
            "quick": False,
        }
        for k in range(args.rounds):
            pair: dict[str, Any] = {}
            for with_dashboard in (False, True):
                redis.flush()
                name = "with" if with_dashboard else "without"
                pair[name] = one_drain(base, args.n, with_dashboard)
                print(
                    f"round {k + 1} {name:7s} dashboard: {pair[name]['jobs_per_s']:,.0f} jobs/s "
                    f"(drain {pair[name]['drain_s']:.2f} s; page requests "
                    f"{pair[name]['requests']})",
                    flush=True,
                )
            pair["ratio"] = round(pair["with"]["jobs_per_s"] / pair["without"]["jobs_per_s"], 3)
            print(f"round {k + 1} with/without: {pair['ratio']:.3f}", flush=True)
            out["rounds"].append(pair)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
