"""``shardq submit|get|cancel|watch`` and ``shardq jobs list``: a tenant's jobs."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from shardq.client import JobState
from shardq.common.errors import InvalidArgument
from shardq.coordinator.cli.api.render import job_dict, print_job, print_jobs, state_name
from shardq.coordinator.cli.api.request import PAGE_ARGS, api_client, payload_arg
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json

commands = Commands("api", groups={"jobs": "a tenant's jobs"})

STATE_NAMES = {
    state.name.lower(): state
    for state in (JobState.SCHEDULED, JobState.READY, JobState.ACTIVE, JobState.DEAD)
}


def _unix_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


@commands.add(
    "submit",
    help="submit a job",
    args=(
        arg("handler", metavar="HANDLER"),
        arg("payload", metavar="PAYLOAD_JSON", nargs="?", help="JSON handed to the handler"),
        arg("--priority", type=int, default=0, help="0 to 9, 9 most urgent (default 0)"),
        arg("--delay-ms", type=int, help="run this many ms from now"),
        arg("--run-at-ms", type=int, help="run at this unix time in ms"),
        arg("--max-attempts", type=int, default=0, help="attempts before dead (server default)"),
        arg("--request-id", help="idempotency key (default: a new one)"),
        arg("--queue", default="", help="queue the job waits in (default: default)"),
    ),
)
def submit(args: argparse.Namespace) -> int:
    if args.delay_ms is not None and args.run_at_ms is not None:
        raise InvalidArgument("give --delay-ms or --run-at-ms, not both", field="delay_ms")
    payload = payload_arg(args.payload)
    with api_client(args) as client:
        sub = client.submit(
            args.handler,
            payload,
            request_id=args.request_id,
            priority=args.priority,
            delay=None if args.delay_ms is None else timedelta(milliseconds=args.delay_ms),
            run_at=None
            if args.run_at_ms is None
            else datetime.fromtimestamp(args.run_at_ms / 1000, UTC),
            max_attempts=args.max_attempts,
            queue=args.queue,
        )
    if args.json:
        print_json({"job": job_dict(sub.job), "deduplicated": sub.deduplicated})
    else:
        note = " (deduplicated: this request_id was submitted before)" if sub.deduplicated else ""
        print(f"{sub.job_id}  {state_name(sub.job.state)}{note}")
    return 0


@commands.add("get", help="show one job", args=(arg("job_id", metavar="JOB_ID"),))
def get(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        job = client.get(args.job_id)
    if args.json:
        print_json(job_dict(job))
    else:
        print_job(job)
    return 0


@commands.add(
    "cancel",
    help="cancel a job (an active one finishes its attempt, then ends cancelled)",
    args=(arg("job_id", metavar="JOB_ID"),),
)
def cancel(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        job = client.cancel(args.job_id)
    if args.json:
        print_json(job_dict(job))
    elif job.cancel_requested and job.state is not JobState.CANCELLED:
        print(f"{job.job_id}  cancel requested: it is active and ends cancelled")
    else:
        print(f"{job.job_id}  {state_name(job.state)}")
    return 0


@commands.add(
    "watch",
    help="follow a job until it succeeds, dies or is cancelled (a line per change)",
    args=(arg("job_id", metavar="JOB_ID"),),
)
def watch(args: argparse.Namespace) -> int:
    updates = []
    with api_client(args) as client:
        for job in client.watch(args.job_id):
            updates.append(job)
            if not args.json:
                error = f"  {' '.join(job.error.split())[:80]}" if job.error else ""
                print(
                    f"{datetime.now(UTC):%H:%M:%S}  {state_name(job.state):<9}  "
                    f"attempt {job.attempts}/{job.max_attempts}{error}",
                    flush=True,
                )
    if args.json:
        print_json([job_dict(j) for j in updates])
    return 0


@commands.add(
    "jobs",
    "list",
    help="list a page of the tenant's jobs in one state",
    args=(arg("--state", required=True, choices=sorted(STATE_NAMES)), *PAGE_ARGS),
)
def jobs_list(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        page = client.list_jobs(STATE_NAMES[args.state], args.page_size, args.page_token)
    if args.json:
        print_json({"jobs": [job_dict(j) for j in page], "next_page_token": page.next_page_token})
    else:
        print_jobs(page.items, page.next_page_token)
    return 0
