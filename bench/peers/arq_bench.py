"""arq driver: 2 `arq` worker processes; arq needs redis-py < 6, so it has its own venv."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from _common import bin_of
from arq import create_pool
from arq.connections import RedisSettings
from scenarios import SHARED_PROCESSES, pick_tuning, serve_peer

WORKERS = 2
TUNINGS: dict[str, dict[str, Any]] = {
    "defaults": {"max_jobs": 10, "poll_delay_s": 0.5},
    # max_jobs is arq's jobs in flight per (asyncio) worker process, what shardq's
    # --concurrency is. poll_delay has no shardq counterpart (a shardq worker wakes when a job
    # is queued): at arq's 0.5 s a worker polls twice a second, which caps its drain rate and
    # adds up to 500 ms to an idle job's start, so the tuned arq polls every 10 ms.
    "tuned": {
        "max_jobs": int(os.environ.get("BENCH_ARQ_MAX_JOBS", "200")),
        "poll_delay_s": float(os.environ.get("BENCH_ARQ_POLL_DELAY", "0.01")),
    },
}
NOTE = (
    "2 worker processes in both variants (one per core); the tuned knobs are max_jobs (jobs "
    "in flight per process: 10 by default, 200 tuned, as shardq's --concurrency 200; "
    "queue_read_limit left at arq's default, max(5 x max_jobs, 100)) and poll_delay (0.5 s "
    "by default, 0.01 s tuned); keep_result=0 in both"
)


class ArqPeer:
    name = "arq"
    bulk_api = None  # enqueue_job is one job per call (a WATCH/MULTI transaction)
    delay_api = "enqueue_job(_defer_until=run_at) (= _defer_by)"

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        _, self.knobs, self.tuning = pick_tuning(req, TUNINGS, NOTE)
        self.concurrency = {
            "processes": WORKERS,
            "how": f"{WORKERS} x `arq arq_app.WorkerSettings`, max_jobs={self.knobs['max_jobs']}, "
            f"poll_delay={self.knobs['poll_delay_s']}s (arq defaults: 10, 0.5 s), keep_result=0",
        }
        self.processes_all = [
            {"process": "arq worker", "count": WORKERS,
             "role": "polls Redis, runs up to max_jobs jobs at once (asyncio)"},
            *SHARED_PROCESSES,
        ]  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(RedisSettings.from_dsn(self.url)))

    def submit(self, number: int) -> None:
        self.loop.run_until_complete(self.pool.enqueue_job("noop", number))

    def submit_many(self, numbers: Sequence[int]) -> None:
        raise NotImplementedError

    def submit_at(self, number: int, run_at: float) -> None:
        when = datetime.fromtimestamp(run_at, UTC)
        self.loop.run_until_complete(self.pool.enqueue_job("noop", number, _defer_until=when))

    def worker_commands(self) -> list[list[str]]:
        cmd = [bin_of("arq"), "--custom-log-dict", "arq_app.LOG_CONFIG", "arq_app.WorkerSettings"]
        return [cmd for _ in range(WORKERS)]

    def worker_extra_env(self) -> dict[str, str]:
        return {
            "BENCH_REDIS_URL": self.url,
            "BENCH_ARQ_MAX_JOBS": str(self.knobs["max_jobs"]),
            "BENCH_ARQ_POLL_DELAY": str(self.knobs["poll_delay_s"]),
        }

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


if __name__ == "__main__":
    serve_peer(
        ArqPeer,
        "arq",
        {"arq": version("arq"), "redis-py": version("redis"), "python": sys.version.split()[0]},
        TUNINGS,
    )
