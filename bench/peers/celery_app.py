"""The Celery app the benchmark workers run (`celery -A celery_app worker`)."""

import os

from _common import record_start
from celery import Celery

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue="bench",
    task_ignore_result=True,  # fire-and-forget: no result backend, like the other peers' no-ops
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="noop")
def noop(number: int) -> None:
    record_start(number)
