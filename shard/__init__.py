"""One shard's Redis: key layout, Lua scripts, the typed API over them, and the shard loop."""

from shard.client import ShardClient
from shard.clock import FakeClock, SystemClock
from shard.errors import ItemCode
from shard.keys import Keys
from shard.models import ClaimedJob, Failure, Lease, Limits, NewJob, ScheduleSpec, ShardSettings

__all__ = [
    "ClaimedJob",
    "Failure",
    "FakeClock",
    "ItemCode",
    "Keys",
    "Lease",
    "Limits",
    "NewJob",
    "ScheduleSpec",
    "ShardClient",
    "ShardSettings",
    "SystemClock",
]
