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
from scenarios import serve_peer

WORKERS = 2


class ArqPeer:
    name = "arq"
    bulk_api = None  # enqueue_job is one job per call (a WATCH/MULTI transaction)
    delay_api = "enqueue_job(_defer_until=run_at) (= _defer_by)"

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        os.environ["BENCH_REDIS_URL"] = self.url
        import arq_app  # noqa: PLC0415 -- reads the settings from the environment

        settings = arq_app.WorkerSettings
        self.concurrency = {
            "processes": WORKERS,
            "how": f"{WORKERS} x `arq arq_app.WorkerSettings`, max_jobs={settings.max_jobs}, "
            f"poll_delay={settings.poll_delay}s (arq defaults: 10, 0.5 s), keep_result=0",
        }
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
        return {"BENCH_REDIS_URL": self.url}

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


if __name__ == "__main__":
    serve_peer(
        ArqPeer,
        "arq",
        {"arq": version("arq"), "redis-py": version("redis"), "python": sys.version.split()[0]},
    )
