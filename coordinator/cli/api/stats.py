"""``shardq stats``: a tenant's queue depths and totals, or every tenant's (admin token)."""

from __future__ import annotations

import argparse

from shardq.client import TenantStats
from shardq.client.model import to_json_ready
from shardq.coordinator.cli.api.request import api_client
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json, print_table

commands = Commands("api")


_STATS_HEADERS = [
    "TENANT", "SHARD", "SCHEDULED", "READY", "ACTIVE", "DEAD", "SUBMITTED", "COMPLETED", "FAILED",
    "UNRUNNABLE", "PAUSED",
]  # fmt: skip


def _paused(t: TenantStats) -> str:
    """``yes`` (the whole tenant), its paused queues, or ``-``."""
    if t.paused:
        return "yes"
    return ",".join(t.paused_queues) or "-"


def _stats_row(t: TenantStats) -> list[object]:
    return [
        t.tenant_id, t.shard_id, t.scheduled, t.ready, t.active, t.dead,
        t.submitted_total, t.completed_total, t.failed_total, t.unrunnable_total, _paused(t),
    ]  # fmt: skip


@commands.add(
    "stats",
    help="a tenant's queue depths and totals (admin: --all for every tenant)",
    args=(
        arg("tenant_id", metavar="TENANT", nargs="?", help="tenant (default: the token's)"),
        arg("--all", action="store_true", help="every tenant of every shard (admin token)"),
    ),
)
def stats(args: argparse.Namespace) -> int:
    if args.tenant_id:
        args.tenant = args.tenant_id
    with api_client(args) as client:
        if args.all:
            found: list[TenantStats] = []
            token = ""
            while True:
                page = client.list_tenant_stats(page_size=1000, page_token=token)
                found += page.items
                token = page.next_page_token
                if not token:
                    break
        else:
            found = [client.tenant_stats()]
    if args.json:
        docs = [to_json_ready(t) for t in found]
        print_json(docs if args.all else docs[0])
    else:
        print_table(_STATS_HEADERS, [_stats_row(t) for t in found])
    return 0
