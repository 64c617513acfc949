"""The dramatiq actor the benchmark workers run (`dramatiq dramatiq_app`)."""

import os

import dramatiq
from _common import record_start
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop(number: int) -> None:
    record_start(number)
