"""Celery driver: one `celery worker` with a prefork pool of 2 processes on the Redis broker."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any, ClassVar

from _common import bin_of
from scenarios import serve_peer

POOL = os.environ.get("BENCH_CELERY_POOL", "prefork")
CONCURRENCY = 2


class CeleryPeer:
    name = "celery"
    bulk_api = None  # group()/chunks() still publish one message per task: no bulk enqueue
    delay_api = "apply_async(eta=run_at) (= countdown; ETA tasks wait in worker memory)"
    concurrency: ClassVar[dict[str, Any]] = {
        "processes": CONCURRENCY,
        "how": f"1 x `celery worker -P {POOL} -c {CONCURRENCY} --without-gossip "
        "--without-mingle --without-heartbeat`, default prefetch multiplier (4), "
        "no result backend",
    }

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        os.environ["BENCH_REDIS_URL"] = self.url
        import celery_app  # noqa: PLC0415 -- reads BENCH_REDIS_URL at import

        self.app = celery_app.app
        self.noop = celery_app.noop

    def submit(self, number: int) -> None:
        self.noop.delay(number)

    def submit_many(self, numbers: Sequence[int]) -> None:
        raise NotImplementedError

    def submit_at(self, number: int, run_at: float) -> None:
        self.noop.apply_async((number,), eta=datetime.fromtimestamp(run_at, UTC))

    def worker_commands(self) -> list[list[str]]:
        return [
            [
                bin_of("celery"),
                "-A",
                "celery_app",
                "worker",
                "-P",
                POOL,
                "-c",
                str(CONCURRENCY),
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "WARNING",
                "-Q",
                "bench",
            ]
        ]

    def worker_extra_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.url}

    def close(self) -> None:
        self.app.close()


if __name__ == "__main__":
    serve_peer(
        CeleryPeer,
        "celery",
        {
            "celery": version("celery"),
            "kombu": version("kombu"),
            "redis-py": version("redis"),
            "python": sys.version.split()[0],
        },
    )
