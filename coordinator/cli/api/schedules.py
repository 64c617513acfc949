"""``shardq schedules ...``: a tenant's recurring schedules (cron expressions that submit a
job each time they fire)."""

from __future__ import annotations

import argparse
from typing import Any

from shardq.client import job_spec
from shardq.coordinator.cli.api.render import json_value, message_dict
from shardq.coordinator.cli.api.request import api_client, payload_arg
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json, print_table, when

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
    template = job_spec(args.handler, payload_arg(args.payload, "PAYLOAD"), priority=args.priority)
    template.ClearField("request_id")  # each tick gets its own
    with api_client(args) as client:
        sched = client.create_schedule(args.schedule_id, args.cron, template, args.tz)
    if args.json:
        print_json(schedule_dict(sched))
    else:
        print(f"schedule {sched.schedule_id}: next run at {when(sched.next_run_at_unix_ms)}")
    return 0


def schedule_dict(s: Any) -> dict[str, Any]:
    out = message_dict(s)
    out["job_template"]["payload"] = json_value(s.job_template.payload)
    return out


@commands.add("schedules", "list", help="list the tenant's schedules")
def schedules_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        found = client.list_schedules()
    if args.json:
        print_json([schedule_dict(s) for s in found])
        return 0
    print_table(
        ["ID", "CRON", "TIME_ZONE", "HANDLER", "NEXT_RUN"],
        [
            [
                s.schedule_id,
                s.cron,
                s.time_zone,
                s.job_template.handler,
                when(s.next_run_at_unix_ms),
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
