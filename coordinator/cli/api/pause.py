"""``shardq pause`` and ``shardq resume``: stop and restart claims of a tenant (``--tenant``), of a
queue for every tenant (``--queue``), or of one tenant's queue (both). Admin token."""

from __future__ import annotations

import argparse

from shardq.common.errors import InvalidArgument
from shardq.coordinator.cli.api.request import api_client
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json

commands = Commands("api")

QUEUE_ARG = arg("--queue", default="", help="queue (alone: for every tenant, on every shard)")


def _target(args: argparse.Namespace) -> str:
    if not args.tenant and not args.queue:
        raise InvalidArgument("give --tenant, --queue, or both", field="tenant")
    if not args.queue:
        return f"tenant {args.tenant}"
    if not args.tenant:
        return f"queue {args.queue} (every tenant)"
    return f"queue {args.queue} of tenant {args.tenant}"


def _run(args: argparse.Namespace, resume: bool) -> int:
    what = _target(args)
    with api_client(args) as client:
        if resume:
            client.resume(args.tenant, args.queue)
        else:
            client.pause(args.tenant, args.queue)
    verb = "resumed" if resume else "paused"
    if args.json:
        print_json({verb: {"tenant_id": args.tenant, "queue": args.queue}})
    else:
        print(f"{verb} {what}")
    return 0


@commands.add(
    "pause",
    help="stop claims of a tenant (--tenant), a queue (--queue) or a tenant's queue (both); "
    "submits are still accepted (admin token)",
    args=(QUEUE_ARG,),
)
def pause(args: argparse.Namespace) -> int:
    return _run(args, resume=False)


@commands.add(
    "resume",
    help="undo a pause of the same --tenant and/or --queue; workers start at once (admin token)",
    args=(QUEUE_ARG,),
)
def resume(args: argparse.Namespace) -> int:
    return _run(args, resume=True)
