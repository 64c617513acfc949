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
    # The driver (arq_bench.py) sets both for the variant it runs (defaults or tuned); unset,
    # they are arq's own defaults.
    max_jobs = int(os.environ.get("BENCH_ARQ_MAX_JOBS", "10"))
    poll_delay = float(os.environ.get("BENCH_ARQ_POLL_DELAY", "0.5"))
    keep_result = 0  # the no-op's result is not read; the other peers store none either


LOG_CONFIG = {"version": 1, "disable_existing_loggers": False}  # no per-job log lines
