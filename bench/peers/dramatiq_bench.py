"""dramatiq driver: `dramatiq` with 2 processes x 8 threads (its defaults on 2 cores)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any, ClassVar

from _common import bin_of
from scenarios import serve_peer

PROCESSES = 2
THREADS = 8


class DramatiqPeer:
    name = "dramatiq"
    bulk_api = None  # group() enqueues message by message: no bulk enqueue
    delay_api = "send_with_options(delay=ms until run_at)"
    concurrency: ClassVar[dict[str, Any]] = {
        "processes": PROCESSES,
        "how": f"1 x `dramatiq dramatiq_app --processes {PROCESSES} --threads {THREADS}` "
        "(its defaults on 2 cores), RedisBroker, default middleware",
    }

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        os.environ["BENCH_REDIS_URL"] = self.url
        import dramatiq_app  # noqa: PLC0415 -- reads BENCH_REDIS_URL at import

        self.broker = dramatiq_app.broker
        self.noop = dramatiq_app.noop

    def submit(self, number: int) -> None:
        self.noop.send(number)

    def submit_many(self, numbers: Sequence[int]) -> None:
        raise NotImplementedError

    def submit_at(self, number: int, run_at: float) -> None:
        delay_ms = max(0, int((run_at - time.time()) * 1000))
        self.noop.send_with_options(args=(number,), delay=delay_ms)

    def worker_commands(self) -> list[list[str]]:
        return [
            [
                bin_of("dramatiq"),
                "dramatiq_app",
                "--processes",
                str(PROCESSES),
                "--threads",
                str(THREADS),
            ]
        ]

    def worker_extra_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.url, "dramatiq_restart_delay": "0"}

    def close(self) -> None:
        self.broker.close()


if __name__ == "__main__":
    serve_peer(
        DramatiqPeer,
        "dramatiq",
        {
            "dramatiq": version("dramatiq"),
            "redis-py": version("redis"),
            "python": sys.version.split()[0],
        },
    )
