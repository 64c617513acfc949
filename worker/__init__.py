"""The shardq worker runtime: write handlers, run a worker on them.

from worker import Worker, handler

@handler("email.send")
async def send(ctx, payload: dict) -> dict: ...
"""

from worker.context import Context
from worker.handlers import HandlerSpec, PermanentFailure, RetryLater, handler
from worker.runtime import Worker, serve
from worker.settings import WorkerSettings

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
