"""The shardq worker runtime: write handlers, run a worker on them.

from shardq.worker import handler, Context, RetryLater, PermanentFailure

@handler("email.send")
async def send(ctx, payload: dict) -> dict: ...
"""

from shardq.worker.context import Context
from shardq.worker.handlers import HandlerSpec, PermanentFailure, RetryLater, handler
from shardq.worker.runtime import Worker, serve
from shardq.worker.settings import WorkerSettings

__all__ = [
    "Context",
    "HandlerSpec",
    "PermanentFailure",
    "RetryLater",
    "Worker",
    "WorkerSettings",
    "handler",
    "serve",
]
