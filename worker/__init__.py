"""The shardq worker runtime: write handlers, run a worker on them.

from shardq.worker import handler, Context, Retry, RetryLater, PermanentFailure

@handler("email.send", retry=Retry(base=1.0, max=60.0, permanent=(ValueError,)))
async def send(ctx, payload: dict) -> dict:
    await ctx.progress(0.5, "half way")
    ...
"""

from shardq.worker.context import Context
from shardq.worker.handlers import HandlerSpec, PermanentFailure, Retry, RetryLater, handler
from shardq.worker.runtime import Worker, serve
from shardq.worker.settings import WorkerSettings

__all__ = [
    "Context",
    "HandlerSpec",
    "PermanentFailure",
    "Retry",
    "RetryLater",
    "Worker",
    "WorkerSettings",
    "handler",
    "serve",
]
