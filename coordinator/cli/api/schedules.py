"""``shardq schedules ...``: a tenant's recurring schedules (cron expressions that submit a
job each time they fire)."""

from __future__ import annotations

import argparse

from shardq.coordinator.cli.api.render import at
from shardq.coordinator.cli.api.request import api_client, payload_arg
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json, print_table

commands = Commands("api", groups={"schedules": "a tenant's recurring schedules"})


@commands.add(
    "schedules",
    "create",
    help="create a recurring schedule (the same definition again is a no-op)",
    args=(
        arg("schedule_id", metavar="ID"),
        arg("cron", metavar="CRON", help='5-field cron expression, e.g. "0 6 * * *"'),
        arg("handler", metavar="HANDLER"),
        arg("payload", metavar="PAYLOAD", nargs="?", help="JSON handed to each job"),
        arg("--tz", default="UTC", help="IANA time zone of the cron expression (default UTC)"),
        arg("--priority", type=int, default=0, help="priority of each job (0 to 9)"),
    ),
)
def schedules_create(args: argparse.Namespace) -> int:
    payload = payload_arg(args.payload, "PAYLOAD")
    with api_client(args) as client:
        sched = client.schedule(
            args.schedule_id,
            args.cron,
            args.handler,
            payload,
            timezone=args.tz,
            priority=args.priority,
        )
    if args.json:
        print_json(sched.to_dict())
    else:
        print(f"schedule {sched.schedule_id}: next run at {at(sched.next_run_at)}")
    return 0


@commands.add("schedules", "list", help="list the tenant's schedules")
def schedules_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        found = client.list_schedules()
    if args.json:
        print_json([s.to_dict() for s in found])
        return 0
    print_table(
        ["ID", "CRON", "TIME_ZONE", "HANDLER", "NEXT_RUN"],
        [
            [
                s.schedule_id,
                s.cron,
                s.timezone,
                s.handler,
                at(s.next_run_at),
            ]
            for s in found
        ],
    )
    return 0


@commands.add(
    "schedules",
    "delete",
    help="delete a schedule (jobs it created stay)",
    args=(arg("schedule_id", metavar="ID"),),
)
def schedules_delete(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        client.delete_schedule(args.schedule_id)
    if args.json:
        print_json({"deleted": args.schedule_id})
    else:
        print(f"deleted schedule {args.schedule_id}")
    return 0
