"""dramatiq driver: `dramatiq` with 2 processes x 8 threads (its defaults on 2 cores), or
x 200 threads (tuned: as many jobs in flight per process as shardq's tuned worker)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from importlib.metadata import version
from typing import Any

from _common import bin_of
from scenarios import SHARED_PROCESSES, pick_tuning, serve_peer

#: Both variants: one worker process per core (dramatiq's own default is the CPU count).
PROCESSES = 2
TUNINGS: dict[str, dict[str, Any]] = {
    "defaults": {"processes": PROCESSES, "threads": 8},
    # Threads are dramatiq's jobs in flight per process, what shardq's --concurrency is.
    "tuned": {
        "processes": PROCESSES,
        "threads": int(os.environ.get("BENCH_DRAMATIQ_THREADS", "200")),
    },
}
NOTE = (
    "--processes 2 in both variants (one per core); the tuned knob is --threads (jobs in "
    "flight per process: 8 by default, 200 tuned, as shardq's --concurrency 200); dramatiq "
    "prefetches twice its threads per process (dramatiq_queue_prefetch unset)"
)


class DramatiqPeer:
    name = "dramatiq"
    bulk_api = None  # group() enqueues message by message: no bulk enqueue
    delay_api = "send_with_options(delay=ms until run_at)"

    def __init__(self, req: dict[str, Any]):
        self.url = req["redis_url"]
        os.environ["BENCH_REDIS_URL"] = self.url
        import dramatiq_app  # noqa: PLC0415 -- reads BENCH_REDIS_URL at import

        self.broker = dramatiq_app.broker
        self.noop = dramatiq_app.noop
        _, self.knobs, self.tuning = pick_tuning(req, TUNINGS, NOTE)
        processes, threads = self.knobs["processes"], self.knobs["threads"]
        self.concurrency = {
            "processes": processes,
            "how": f"1 x `dramatiq dramatiq_app --processes {processes} --threads {threads}`, "
            "RedisBroker, default middleware",
        }
        self.processes_all = [
            {"process": "dramatiq (main)", "count": 1,
             "role": "starts and watches the worker processes, collects their logs"},
            {"process": "dramatiq worker process", "count": processes,
             "role": f"a consumer thread (prefetching) and {threads} worker threads running jobs"},
            *SHARED_PROCESSES,
        ]  # fmt: skip

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
                str(self.knobs["processes"]),
                "--threads",
                str(self.knobs["threads"]),
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
        TUNINGS,
    )
