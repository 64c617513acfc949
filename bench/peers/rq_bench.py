"""rq driver: 2 `rq worker` processes (SimpleWorker: jobs run in the worker process), its
scheduler for delays. One variant: rq has no concurrency or prefetch knob to tune."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Any, ClassVar

import rq_app
from _common import bin_of
from redis import Redis
from rq import Queue
from scenarios import SHARED_PROCESSES, serve_peer

WORKERS = 2
QUEUE = "bench"
# SimpleWorker runs jobs in the worker process; the default Worker forks a work horse per job
# and drained ~5x slower in a trial run here. BENCH_RQ_WORKER_CLASS=rq.Worker measures that one.
WORKER_CLASS = os.environ.get("BENCH_RQ_WORKER_CLASS", "rq.worker.SimpleWorker")
FORKS = WORKER_CLASS != "rq.worker.SimpleWorker"


class RqPeer:
    name = "rq"
    bulk_api = "Queue.enqueue_many (one pipeline per batch)"
    delay_api = "Queue.enqueue_at (worker --with-scheduler)"
    concurrency: ClassVar[dict[str, Any]] = {
        "processes": WORKERS,
        "how": f"{WORKERS} x `rq worker --with-scheduler --worker-class {WORKER_CLASS}`; "
        "one of them holds the scheduler lock; per-job log lines off",
    }
    # Stated, not chosen: an rq worker process takes one job at a time (BLPOP one, run it),
    # so the only way to more jobs in flight is more worker processes, which every system
    # keeps at 2 (one per core). The worker class is the one setting that is not rq's default.
    tuning: ClassVar[dict[str, Any]] = {
        "variant": None,
        "knobs": {"jobs_in_flight_per_process": 1, "worker_class": WORKER_CLASS},
        "library_defaults": {"jobs_in_flight_per_process": 1, "worker_class": "rq.Worker"},
        "note": "rq has no concurrency or prefetch knob: one job at a time per worker process "
        "(2 processes, one per core, as every system), so it runs in one variant only. Not "
        "rq's default: SimpleWorker runs the job in the worker process; the default rq.Worker "
        "forks a work horse per job (~5x slower drain in a trial here)",
    }
    processes_all: ClassVar[list[dict[str, Any]]] = [
        {"process": "rq worker", "count": WORKERS,
         "role": "BLPOPs one job and runs it" + (" in a forked work horse" if FORKS else "")
         + "; one of them also moves due delayed jobs (scheduler lock)"},
        *SHARED_PROCESSES,
    ]  # fmt: skip

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        self.redis = Redis.from_url(self.url)
        self.queue = Queue(QUEUE, connection=self.redis)

    def submit(self, number: int) -> None:
        self.queue.enqueue(rq_app.noop, number)

    def submit_many(self, numbers: Sequence[int]) -> None:
        self.queue.enqueue_many([Queue.prepare_data(rq_app.noop, (n,)) for n in numbers])

    def submit_at(self, number: int, run_at: float) -> None:
        self.queue.enqueue_at(datetime.fromtimestamp(run_at, UTC), rq_app.noop, number)

    def worker_commands(self) -> list[list[str]]:
        cmd = [bin_of("rq"), "worker", "--url", self.url, "--with-scheduler"]
        cmd += ["--worker-class", WORKER_CLASS]
        cmd += ["--logging_level", "WARNING", "--disable-job-desc-logging", QUEUE]
        return [[*cmd, "--name", f"bench-{k}"] for k in range(WORKERS)]

    def worker_extra_env(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        self.redis.close()


if __name__ == "__main__":
    serve_peer(
        RqPeer,
        "rq",
        {"rq": version("rq"), "redis-py": version("redis"), "python": sys.version.split()[0]},
    )
