"""``shardq dead ...``: a tenant's dead-letter set (jobs out of attempts)."""

from __future__ import annotations

import argparse

from shardq.common.errors import InvalidArgument
from shardq.coordinator.cli.api.render import job_dict, print_jobs
from shardq.coordinator.cli.api.request import PAGE_ARGS, api_client
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import plural, print_json

commands = Commands("api", groups={"dead": "a tenant's dead-letter set"})


@commands.add(
    "dead",
    "list",
    help="list a page of the tenant's dead jobs, most recently dead first",
    args=PAGE_ARGS,
)
def dead_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        page = client.list_dead(args.page_size, args.page_token)
    if args.json:
        print_json({"jobs": [job_dict(j) for j in page], "next_page_token": page.next_page_token})
    else:
        print_jobs(page.items, page.next_page_token, dead=True)
    return 0


@commands.add(
    "dead",
    "requeue",
    help="move dead jobs back to ready with fresh attempts",
    args=(
        arg("job_ids", metavar="JOB_ID", nargs="*", help="dead jobs to requeue"),
        arg("--all", action="store_true", help="every dead job of the tenant"),
    ),
)
def dead_requeue(args: argparse.Namespace) -> int:
    if bool(args.job_ids) == args.all:
        raise InvalidArgument("give JOB_IDs or --all", field="job_ids")
    with api_client(args) as client:
        resp = client.requeue_dead(args.job_ids, all=args.all)
    if args.json:
        print_json({"requeued_count": resp.requeued, "not_found_job_ids": list(resp.not_found)})
    else:
        print(f"requeued {plural(resp.requeued, 'job')}")
        if resp.not_found:
            print(f"not dead or unknown: {' '.join(resp.not_found)}")
    return 0
