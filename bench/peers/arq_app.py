"""The arq job and worker settings (`arq arq_app.WorkerSettings`)."""

import os
from typing import Any, ClassVar

from _common import record_start
from arq.connections import RedisSettings


async def noop(ctx: dict[str, Any], number: int) -> None:
    record_start(number)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [noop]
    redis_settings = RedisSettings.from_dsn(
        os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    # Not arq's defaults (max_jobs=10, poll_delay=0.5 s): with those a worker polls the queue
    # twice a second, which caps its drain rate and adds up to 500 ms to an idle job's start.
    max_jobs = int(os.environ.get("BENCH_ARQ_MAX_JOBS", "100"))
    poll_delay = float(os.environ.get("BENCH_ARQ_POLL_DELAY", "0.01"))
    keep_result = 0  # the no-op's result is not read; the other peers store none either


LOG_CONFIG = {"version": 1, "disable_existing_loggers": False}  # no per-job log lines
