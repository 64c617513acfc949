"""``shardq dev`` and ``shardq demo``: the local cluster and its demo load
(``shardq.coordinator.tools``). Here the two meet: ``dev --demo`` gets ``demo``'s workload
from this module, so neither tool imports the other. ``shardq soak``: a local cluster under
load and faults, reconciled at the end."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable

from shardq.coordinator.cli.command import Commands
from shardq.coordinator.tools import demo, dev, soak

commands = Commands("local")


@commands.add(
    "dev",
    help="run a whole local cluster (Redis shards, Postgres, coordinator, shard loops, "
    "workers) until Ctrl-C",
    args=(dev.add_arguments,),
)
def run_dev(args: argparse.Namespace) -> Awaitable[int]:
    return dev.run(args, demo=demo.run_demo)


commands.add(
    "demo",
    help="submit a mixed workload (tenants, priorities, delays, retries, a dead letter, "
    "a schedule) to a running cluster, with the admin token",
    args=(demo.add_arguments,),
    kind="api",
)(demo.run)


commands.add(
    "soak",
    help="run a local cluster under load across tenants while faults are injected at random, "
    "then reconcile every accepted job (exit 1 when any was lost, duplicated or stuck)",
    args=(soak.add_arguments,),
)(soak.run)
