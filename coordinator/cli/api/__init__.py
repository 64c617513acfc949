"""The API user's commands: they call the coordinator over gRPC through ``shardq.client``, as
a tenant (its token) or for one (the admin token and ``--tenant``). One module per noun."""

from __future__ import annotations

from shardq.coordinator.cli.api import dead, jobs, pause, schedules, shards, stats, tenants
from shardq.coordinator.cli.command import Command

#: In the order ``shardq --help`` lists them.
MODULES = (jobs, dead, schedules, stats, tenants, pause, shards)
COMMANDS: list[Command] = [c for m in MODULES for c in m.commands.items]
