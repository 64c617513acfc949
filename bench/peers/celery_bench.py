"""Celery driver: one `celery worker` with a prefork pool of 2 processes on the Redis broker."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any

from _common import bin_of
from scenarios import SHARED_PROCESSES, pick_tuning, serve_peer

POOL = os.environ.get("BENCH_CELERY_POOL", "prefork")
#: Both variants: a prefork pool runs one job at a time per process, so the pool size is the
#: process count, which every system keeps at 2 (one per core; celery's own default -c is
#: the CPU count, the same here).
CONCURRENCY = 2
TUNINGS: dict[str, dict[str, Any]] = {
    "defaults": {"concurrency": CONCURRENCY, "prefetch_multiplier": 4},
    # The knob that matches shardq's claim of up to 100: messages each pool process reserves.
    "tuned": {
        "concurrency": CONCURRENCY,
        "prefetch_multiplier": int(os.environ.get("BENCH_CELERY_PREFETCH", "100")),
    },
}
NOTE = (
    "--concurrency is the prefork pool's size (processes, one job at a time each): 2 in both "
    "variants, one per core; the tuned knob is --prefetch-multiplier (messages reserved per "
    "pool process: 4 by default, 100 tuned, as a shardq claim takes up to 100)"
)


class CeleryPeer:
    name = "celery"
    bulk_api = None  # group()/chunks() still publish one message per task: no bulk enqueue
    delay_api = "apply_async(eta=run_at) (= countdown; ETA tasks wait in worker memory)"

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        os.environ["BENCH_REDIS_URL"] = self.url
        import celery_app  # noqa: PLC0415 -- reads BENCH_REDIS_URL at import

        self.app = celery_app.app
        self.noop = celery_app.noop
        _, self.knobs, self.tuning = pick_tuning(req, TUNINGS, NOTE)
        self.concurrency = {
            "processes": CONCURRENCY,
            "how": f"1 x `celery worker -P {POOL} -c {self.knobs['concurrency']} "
            f"--prefetch-multiplier {self.knobs['prefetch_multiplier']} --without-gossip "
            "--without-mingle --without-heartbeat`, no result backend",
        }
        self.processes_all = [
            {"process": "celery worker (main)", "count": 1,
             "role": "consumes from Redis, reserves messages, hands them to the pool"},
            {"process": f"celery {POOL} pool child", "count": self.knobs["concurrency"],
             "role": "runs the jobs, one at a time each"},
            *SHARED_PROCESSES,
        ]  # fmt: skip

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
                str(self.knobs["concurrency"]),
                "--prefetch-multiplier",
                str(self.knobs["prefetch_multiplier"]),
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
        TUNINGS,
    )
