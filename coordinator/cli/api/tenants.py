"""``shardq tenants limits|set``: a tenant's limits through the API (admin token). The
operator's ``tenants`` commands, which place tenants on shards in the database, are in
``cli/ops/tenants.py``; both live under ``shardq tenants``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from shardq.client import TenantLimits
from shardq.common.errors import InvalidArgument
from shardq.coordinator.cli.api.request import api_client
from shardq.coordinator.cli.command import Commands, arg
from shardq.coordinator.cli.terminal import print_json, print_table

commands = Commands("api")

#: TenantLimits field -> the flag of ``tenants set`` that changes it, and how it reads.
FLAGS: dict[str, tuple[str, type, str]] = {
    "weight": ("--weight", int, "jobs per round-robin turn, 1-1000"),
    "max_active": ("--max-active", int, "most jobs running at once"),
    "submit_rate_per_s": ("--rate", float, "submits per second (a token bucket)"),
    "submit_burst": ("--burst", int, "submits the bucket holds"),
    "max_pending": ("--max-pending", int, "most jobs scheduled, ready or running"),
    "max_pending_bytes": ("--max-pending-bytes", int, "most payload bytes of those jobs"),
    "result_retention_s": (
        "--result-retention",
        int,
        "seconds a finished job's result row is kept before it is purged",
    ),
    "dedupe_window_s": (
        "--dedupe-window",
        int,
        "seconds a request_id is deduplicated after its job is accepted, 30-604800",
    ),
    "max_watch_streams": (
        "--max-watch-streams",
        int,
        "WatchJob streams open at once on each coordinator process",
    ),
}
#: What 0 means in each field once the server's defaults are applied.
ZERO_MEANS = {"submit_burst": "max(1, rate)", "result_retention_s": "kept forever"}


def limits_dict(limits: TenantLimits) -> dict[str, Any]:
    return {name: getattr(limits, name) for name in FLAGS}


def _shown(name: str, value: object) -> str:
    if value == 0:
        return f"0 ({ZERO_MEANS.get(name, 'no limit')})"
    return str(value)


@commands.add(
    "tenants",
    "limits",
    help="a tenant's limits as stored, server defaults applied (admin token)",
    args=(arg("tenant_id", metavar="TENANT"),),
)
def tenants_limits(args: argparse.Namespace) -> int:
    with api_client(args) as client:
        limits = client.tenant_limits(args.tenant_id)
    if args.json:
        print_json({"tenant_id": args.tenant_id, **limits_dict(limits)})
    else:
        print_table(
            ["LIMIT", "VALUE"], [[name, _shown(name, v)] for name, v in limits_dict(limits).items()]
        )
    return 0


@commands.add(
    "tenants",
    "set",
    help="change some of a tenant's limits (the others keep the value they have now; "
    "0 goes back to the server default) and show them before and after (admin token)",
    args=(
        arg("tenant_id", metavar="TENANT"),
        *(
            arg(flag, dest=name, type=kind, metavar="N" if kind is int else "R", help=text)
            for name, (flag, kind, text) in FLAGS.items()
        ),
    ),
)
def tenants_set(args: argparse.Namespace) -> int:
    changes = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    if not changes:
        flags = ", ".join(flag for flag, _, _ in FLAGS.values())
        raise InvalidArgument(f"nothing to change: give one or more of {flags}", field="limits")
    with api_client(args) as client:
        before = client.tenant_limits(args.tenant_id)
        # The change goes onto what the tenant's row sets alone: the defaults stay defaults,
        # and a tenant follows them when they change.
        stored = client.tenant_limits(args.tenant_id, stored_only=True)
        after = client.set_tenant_limits(replace(stored, **changes), args.tenant_id)
    old, new = limits_dict(before), limits_dict(after)
    if args.json:
        print_json({"tenant_id": args.tenant_id, "before": old, "after": new})
        return 0
    print_table(
        ["LIMIT", "BEFORE", "", "AFTER"],
        [
            [
                name,
                _shown(name, old[name]),
                "->" if old[name] != new[name] else "",
                _shown(name, new[name]),
            ]
            for name in FLAGS
        ],
    )
    return 0
