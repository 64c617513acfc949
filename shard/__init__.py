"""One shard's Redis: key layout, Lua scripts, the typed API over them, and the shard loop."""

from shardq.common.clock import FakeClock, SystemClock
from shardq.shard.client import ShardClient
from shardq.shard.codes import ItemCode
from shardq.shard.keys import Keys
from shardq.shard.models import (
    Failure,
    Lease,
    Limits,
    NewJob,
    ScheduleSpec,
    ShardSettings,
    TenantLimits,
)
from shardq.shard.records import ClaimedJob, JobRecord, JobState

__all__ = [
    "ClaimedJob",
    "Failure",
    "FakeClock",
    "ItemCode",
    "JobRecord",
    "JobState",
    "Keys",
    "Lease",
    "Limits",
    "NewJob",
    "ScheduleSpec",
    "ShardClient",
    "ShardSettings",
    "SystemClock",
    "TenantLimits",
]
