"""What ``shardq dev`` shows: the ready text (how to use the cluster), then a live view of
the jobs per shard and the busiest tenants, or a status line every few seconds."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from shardq.client import AsyncClient, RetryPolicy, TenantStats
from shardq.coordinator.cli.terminal import plural
from shardq.coordinator.tools.data_dir import DATA_DIR_VAR, ENV_FILE, default_data_dir
from shardq.coordinator.tools.dev.cluster import DevCluster

READY_LINE = "shardq dev ready"


class Workload(Protocol):
    """A load to submit once the cluster is up (``--demo``: ``shardq demo``'s, which the CLI
    hands in, so this tool does not import that one)."""

    def __call__(
        self, target: str, admin_token: str, *, say: Callable[[str], None]
    ) -> Coroutine[Any, Any, object]: ...


def shardq_command() -> str:
    """How to call the `shardq` CLI from a shell here: bare when PATH finds this one."""
    ours = Path(sys.executable).parent / "shardq"
    found = shutil.which("shardq")
    if found and ours.exists() and Path(found).resolve() == ours.resolve():
        return "shardq"
    return str(ours) if ours.exists() else "shardq"


def env_file_of(cluster: DevCluster) -> Path:
    return cluster.data_dir / ENV_FILE


def env_file_lines(cluster: DevCluster, sq: str) -> list[str]:
    """How commands beside the cluster find it: shardq.env, and the variable that points
    the ``shardq`` command at it when the data dir is not the default one."""
    path = env_file_of(cluster)
    lines = [
        f"Beside this cluster `shardq` needs no flags: it reads {path}",
        f"  {sq} tokens list    {sq} shards show    {sq} stats",
    ]
    if cluster.data_dir != default_data_dir().expanduser().resolve():
        lines.append(f"  (not the default data dir: export {DATA_DIR_VAR}={cluster.data_dir})")
    lines.append(f"A shell gets the same variables with: set -a; . {path}; set +a")
    return lines


def ready_text(cluster: DevCluster) -> str:
    tokens = cluster.tokens
    assert tokens is not None
    args = cluster.args
    tenant, token = sorted(tokens.tenants.items())[0]
    db_note = cluster.database_url if args.database_url else f"embedded ({cluster.database_url})"
    sq = shardq_command()
    conn = f"--coordinator {cluster.target} --token {token}"
    lines = [
        f"{READY_LINE}: coordinator {cluster.target}, {plural(args.shards, 'shard')}, "
        f"{plural(args.workers, 'worker')}, data in {cluster.data_dir}",
        "",
        f"  coordinator   {cluster.target}",
        f"  admin token   {tokens.admin}",
        *(f"  tenant {t} token   {tok}" for t, tok in sorted(tokens.tenants.items())),
        f"  postgres      {db_note}",
        f"  shards        {', '.join(f'127.0.0.1:{r.port}' for r in cluster.redis)}",
        f"  handlers      {args.handlers}",
        f"  logs          {cluster.logs}/",
        *(
            [f"  dashboard     {cluster.dashboard_url}  (log in with a token above)"]
            if cluster.dashboard_url
            else []
        ),
        "",
        f"Submit a job (tenant {tenant}):",
        f'  {sq} submit echo \'{{"hello": "world"}}\' {conn}',
        f"  {sq} watch JOB_ID {conn}",
        "",
        "From Python:",
        "  from shardq import Client",
        f'  with Client("{cluster.target}", token="{token}") as c:',
        '      job = c.wait(c.submit("flaky", {"fail_times": 2}).job_id, timeout=60)',
        "      print(job.state.name, job.result)",
        "",
        *env_file_lines(cluster, sq),
        "",
        f"A mixed workload (tenants, priorities, delays, retries, a dead letter): "
        f"{sq} demo --coordinator {cluster.target} --token {tokens.admin}",
        "Stop: Ctrl-C (stops every process above; data stays in the data dir)",
    ]
    return "\n".join(lines)


@dataclass
class Snapshot:
    at: float
    #: per shard: scheduled, ready, active, dead, submitted, completed, failed, tenants
    shards: dict[int, list[int]]
    tenants: list[TenantStats]

    def total(self, column: int) -> int:
        return sum(row[column] for row in self.shards.values())


COLUMNS = ("scheduled", "ready", "active", "dead", "submitted", "completed", "failed", "tenants")


async def snapshot(client: AsyncClient, shard_count: int) -> Snapshot:
    tenants: list[TenantStats] = []
    token = ""
    while True:
        page = await client.list_tenant_stats(page_size=1000, page_token=token)
        tenants += page.items
        token = page.next_page_token
        if not token:
            break
    shards = {i: [0] * len(COLUMNS) for i in range(shard_count)}
    for t in tenants:
        row = shards.setdefault(t.shard_id, [0] * len(COLUMNS))
        values = (
            t.scheduled, t.ready, t.active, t.dead,
            t.submitted_total, t.completed_total, t.failed_total, 1,
        )  # fmt: skip
        for i, v in enumerate(values):
            row[i] += v
    return Snapshot(time.monotonic(), shards, tenants)


def throughput(history: list[Snapshot], window_s: float = 5.0) -> float:
    """Jobs finished (succeeded or failed) per second over the last ``window_s``."""
    if len(history) < 2:
        return 0.0
    last = history[-1]
    first = next((s for s in history if last.at - s.at <= window_s), history[-2])
    if first is last:
        first = history[-2]
    done = (last.total(5) + last.total(6)) - (first.total(5) + first.total(6))
    return max(0.0, done / max(1e-9, last.at - first.at))


def status_line(snap: Snapshot, rate: float) -> str:
    parts = [f"{name}={snap.total(i)}" for i, name in enumerate(COLUMNS[:7])]
    return f"shardq dev status: {' '.join(parts)} throughput={rate:.1f}/s"


def live_view(snap: Snapshot, rate: float, cluster: DevCluster) -> Any:
    from rich.console import Group  # noqa: PLC0415 - only the live view needs rich
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    shards = Table(title="jobs per shard", title_justify="left", expand=False)
    for name in ("shard", *COLUMNS):
        shards.add_column(name, justify="right")
    for sid, row in sorted(snap.shards.items()):
        cell = f"[bold red]{row[3]}[/]" if row[3] else "0"
        shards.add_row(str(sid), *map(str, row[:3]), cell, *map(str, row[4:]))
    tenants = Table(title="tenants", title_justify="left", expand=False)
    for name in ("tenant", "shard", *COLUMNS[:7]):
        tenants.add_column(name, justify="right")
    busiest = sorted(snap.tenants, key=lambda t: (-t.submitted_total, t.tenant_id))[:10]
    for t in busiest:
        tenants.add_row(
            t.tenant_id, str(t.shard_id),
            *map(str, (t.scheduled, t.ready, t.active, t.dead)),
            *map(str, (t.submitted_total, t.completed_total, t.failed_total)),
        )  # fmt: skip
    dead = snap.total(3)
    summary = Text.from_markup(
        f"throughput [bold]{rate:.1f}[/] jobs/s   finished {snap.total(5)}   "
        f"dead letters [{'bold red' if dead else 'green'}]{dead}[/]   "
        f"processes {len(cluster.pids())} up   (Ctrl-C stops)"
    )
    parts: list[Any] = [summary, shards]
    if busiest:
        parts.append(tenants)
    if dead:
        parts.append(
            Text(
                f"dead letters: {shardq_command()} dead list --tenant TENANT "
                f"--coordinator {cluster.target} --token ADMIN_TOKEN",
                style="dim",
            )
        )
    return Group(*parts)


async def watch(
    cluster: DevCluster, stopping: asyncio.Event, workload: Workload | None = None
) -> None:
    """Show the cluster until ``stopping``; with ``--demo``, submit ``workload`` first."""
    args = cluster.args
    live = not args.no_live and sys.stdout.isatty()
    tokens = cluster.tokens
    assert tokens is not None
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    demo_task: asyncio.Task[object] | None = None
    async with AsyncClient(
        cluster.target, tokens.admin, retry=RetryPolicy(attempts=2), timeout_s=5
    ) as client:
        with contextlib.ExitStack() as stack:
            view = None
            if live:
                from rich.live import Live  # noqa: PLC0415 - only the live view needs rich

                view = stack.enter_context(Live(refresh_per_second=2, transient=False))
                say = view.console.print
            if args.demo and workload is not None:
                demo_task = asyncio.create_task(workload(cluster.target, tokens.admin, say=say))
            try:
                await _refresh(cluster, client, stopping, view, say)
            finally:
                if demo_task is not None:
                    demo_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await demo_task


async def _refresh(
    cluster: DevCluster,
    client: AsyncClient,
    stopping: asyncio.Event,
    view: Any,
    say: Callable[[str], None],
) -> None:
    interval = 1.0 if view is not None else max(0.2, cluster.args.status_interval_s)
    history: list[Snapshot] = []
    while not stopping.is_set():
        cluster.check_children()
        try:
            snap = await snapshot(client, cluster.args.shards)
        except Exception as exc:  # the coordinator is checked above; say why and go on
            say(f"shardq dev: stats unavailable: {' '.join(str(exc).split())[:200]}")
        else:
            history = [*history[-30:], snap]
            rate = throughput(history)
            if view is not None:
                view.update(live_view(snap, rate, cluster))
            else:
                say(status_line(snap, rate))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), interval)
