"""How late delayed jobs start when they come due while their tenant moves between shards.

    python bench/move_lateness.py [--tenants 3] [--jobs 700] [--slot-s 14] [--repeat 1]
                                  [--note TEXT] [--out FILE.json]

A real cluster (``bench/shardq_bench.py``'s ``Cluster``: a database of its own on the local
Postgres, ``shardq migrate`` / ``shards init`` / ``tokens create``, one ``shardq-shard`` loop
per shard, one ``shardq-coordinator`` that runs the moves, ``WORKERS`` × ``shardq-worker``
with the bench's no-op handler) on two redis-server processes of its own. Tenants ``move-0``..
are pinned to shard 0, and a control tenant ``stay-1`` to shard 1 (the target), which it never
leaves. Each of them gets ``--jobs`` delayed jobs per ``--due-span-s`` seconds, due evenly
from the first move's slot to one slot past the last: whenever a move starts, its tenant has
jobs coming due through it, and the control tells a move's lateness apart from what the same
load does to a tenant that does not move. Background tenants ``load-0`` (shard 0) and
``load-1`` (shard 1) submit ``--load-per-s`` and ``--load1-per-s`` jobs/s (``load-0`` also
``--unary-per-s`` unary calls), and every moving tenant keeps submitting ``--busy-per-s``
jobs to run at once, all the while. At the start of its slot each moving tenant is moved to
shard 1 (``shardq tenants move TENANT 1 --yes``, run by the coordinator's mover), one after
another.

A move lasts from its row appearing in ``shardq_moves`` to the row's removal (polled every
5 ms): what ``shardq moves list`` shows. Lateness is start − run_at, the start taken in the
worker by the handler's start record (``bench/peers/_common.py``), for the moving tenant's
delayed jobs due within its move. Lost: submitted jobs never started; duplicates: jobs that
started twice (both over every job of the run). ``control_lateness``: the same for ``stay-1``'s
jobs due within the move.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "peers")]

import psycopg  # noqa: E402
from _common import duplicate_starts, read_starts, summary_ms  # noqa: E402
from redis.asyncio import Redis  # noqa: E402
from shardq_bench import (  # noqa: E402
    NOOP,
    WORKERS,
    Cluster,
    _env,
    _submit_batches,
)

from shardq.coordinator.tools.redis_server import RedisProcess  # noqa: E402

ROOT = HERE.parent
#: Job numbers: tenant k's delayed jobs from DELAYED_BASE * (k + 1); jobs to run at once
#: (the busy streams and the background load) from NOW_BASE on.
DELAYED_BASE = 10_000_000
NOW_BASE = 1_000_000_000


def machine() -> dict[str, Any]:
    cpu_model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": list(os.getloadavg()),
    }


def commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    return out.stdout.strip() + ("+dirty" if dirty else "")


class MoveWatch:
    """When each tenant's row in ``shardq_moves`` appeared and went (unix s), polled."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.seen: dict[str, list[float]] = {}
        self.copying: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            while not stop.is_set():
                cur = await conn.execute("SELECT tenant_id, copying FROM shardq_moves")
                rows = await cur.fetchall()
                now = time.time()
                present = {str(r[0]) for r in rows}
                for tenant, copying in rows:
                    self.seen.setdefault(str(tenant), [now, 0.0])
                    if copying:
                        self.copying.setdefault(str(tenant), now)
                for tenant, span in self.seen.items():
                    if tenant not in present and not span[1]:
                        span[1] = now
                await asyncio.sleep(0.005)

    def window(self, tenant: str) -> tuple[float, float]:
        start, end = self.seen[tenant]
        return start, end


class Probe:
    """Where a moving tenant's due jobs wait, sampled every few ms during its move: due but
    still scheduled on the source, set aside on the source (taken, not yet copied), due but
    still scheduled on the target. For each place, the longest stretch during which some due
    job of the tenant waited there (a lower bound of that job's wait there)."""

    PLACES = ("source_scheduled", "set_aside", "target_scheduled")

    def __init__(self, urls: list[str], prefix: str = "shardq") -> None:
        self.urls = urls
        self.prefix = prefix
        self.stretch: dict[str, dict[str, float]] = {}

    async def run(self, tenant: str, stop: asyncio.Event) -> None:
        longest = dict.fromkeys(self.PLACES, 0.0)
        since: dict[str, float | None] = dict.fromkeys(self.PLACES, None)
        p = self.prefix
        async with Redis.from_url(self.urls[0]) as src, Redis.from_url(self.urls[1]) as dst:
            while not stop.is_set():
                now = time.time()
                ms = int(now * 1000)
                due_src = await src.zcount(f"{p}:tscheduled:{tenant}", "-inf", ms)
                members: set[bytes] = await src.smembers(f"{p}:moving:{tenant}")  # type: ignore[misc]
                aside = [m.decode() for m in members]
                pipe = src.pipeline(transaction=False)
                for job_id in aside:
                    pipe.hget(f"{p}:job:{job_id}", "ra")
                due_aside = sum(1 for ra in await pipe.execute() if ra and int(ra) <= ms)
                due_dst = await dst.zcount(f"{p}:tscheduled:{tenant}", "-inf", ms)
                for place, n in zip(self.PLACES, (due_src, due_aside, due_dst), strict=True):
                    start = since[place]
                    if n and start is None:
                        since[place] = now
                    elif not n and start is not None:
                        longest[place] = max(longest[place], now - start)
                        since[place] = None
                await asyncio.sleep(0.005)
        end = time.time()
        for place, start in since.items():
            if start is not None:
                longest[place] = max(longest[place], end - start)
        self.stretch[tenant] = {k: round(v * 1000, 1) for k, v in longest.items()}


async def producer(
    cluster: Cluster, tenant: str, per_s: float, numbers: list[int], stop: asyncio.Event
) -> None:
    """Jobs to run at once, ``per_s`` a second in batches of 10, numbered from NOW_BASE on
    (shared by every stream: each takes the next free numbers); appended to ``numbers``."""
    if per_s <= 0:
        return
    async with cluster.client(tenant) as client:
        gap = 10 / per_s
        at = time.monotonic()
        while not stop.is_set():
            batch = [next(NUMBERS) for _ in range(10)]
            await _submit_batches(client, batch, 10)
            numbers.extend(batch)
            at += gap
            await asyncio.sleep(max(0.0, at - time.monotonic()))


async def unary_producer(
    cluster: Cluster, tenant: str, per_s: float, numbers: list[int], stop: asyncio.Event
) -> None:
    """Jobs to run at once, ``per_s`` unary SubmitJob calls a second (up to 64 in flight):
    the front door's most expensive call, so the coordinator (which also runs the mover) is
    busy."""
    if per_s <= 0:
        return
    gate = asyncio.Semaphore(64)
    async with cluster.client(tenant) as client:

        async def one(number: int) -> None:
            try:
                await client.submit(NOOP, number)
                numbers.append(number)
            finally:
                gate.release()

        at = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            await gate.acquire()
            task = asyncio.create_task(one(next(NUMBERS)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            at += 1 / per_s
            await asyncio.sleep(max(0.0, at - time.monotonic()))
        await asyncio.gather(*pending)


NUMBERS = itertools.count(NOW_BASE)
#: The tenant that stays on shard 1 (the target) with delayed jobs due all along: the control.
CONTROL = "stay-1"


def move(cluster: Cluster, tenant: str) -> subprocess.Popen[bytes]:
    env = _env({"SHARDQ_DATABASE_URL": cluster.database_url})
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "shardq"), "tenants", "move", tenant, "1", "--yes"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def run_once(args: argparse.Namespace, workdir: str) -> dict[str, Any]:
    movers = [f"move-{k}" for k in range(args.tenants)]
    loads = ["load-0", "load-1", CONTROL]
    redis = [RedisProcess(appendonly=False).start() for _ in range(2)]
    req = {
        "workdir": workdir,
        "postgres_url": args.postgres_url,
        "params": {},
    }
    pins = {**{t: 0 for t in movers}, "load-0": 0, "load-1": 1, CONTROL: 1}
    try:
        with Cluster(req, [r.url for r in redis], [*movers, *loads], pins=pins) as cluster:
            cluster.start_workers()
            return asyncio.run(drive(cluster, args, movers, loads))
    finally:
        for r in redis:
            r.cleanup()


async def submit_delayed(
    cluster: Cluster, args: argparse.Namespace, movers: list[str], first_slot_ms: int
) -> tuple[dict[int, int], dict[int, str]]:
    """Every moving tenant's delayed jobs and the control's, ``--jobs`` per ``--due-span-s``
    each, due evenly from the first slot to one slot past the last: whenever a move happens
    to start (``shardq tenants move`` itself takes seconds to start on a loaded machine), its
    tenant has jobs coming due through it. Returns run-at (unix ms) and tenant by job number."""
    run_at: dict[int, int] = {}
    owner: dict[int, str] = {}
    span = int(args.slot_s * 1000) * (len(movers) + 1)
    n = int(args.jobs * span / (args.due_span_s * 1000))
    due = [first_slot_ms + i * span // n for i in range(n)]
    for k, tenant in enumerate([*movers, CONTROL]):
        numbers = [DELAYED_BASE * (k + 1) + i for i in range(n)]
        run_at.update(zip(numbers, due, strict=True))
        owner.update(dict.fromkeys(numbers, tenant))
        async with cluster.client(tenant) as client:
            await _submit_batches(client, numbers, 100, due)
    return run_at, owner


async def move_in_turn(
    cluster: Cluster, args: argparse.Namespace, movers: list[str], first_slot_ms: int,
    watch: MoveWatch, probe: Probe,
) -> None:  # fmt: skip
    """Move each tenant to shard 1 at its slot's start, one after another."""
    for k, tenant in enumerate(movers):
        slot = first_slot_ms / 1000 + k * args.slot_s
        await asyncio.sleep(max(0.0, slot - time.time()))
        stop = asyncio.Event()
        probing = asyncio.create_task(probe.run(tenant, stop))
        try:
            proc = move(cluster, tenant)
            code = await asyncio.to_thread(proc.wait, 120)
            if code != 0:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"tenants move {tenant} exited {code}: {err[-2000:]}")
            while tenant not in watch.seen or not watch.seen[tenant][1]:
                cluster.check_alive()
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await probing


async def drive(
    cluster: Cluster, args: argparse.Namespace, movers: list[str], loads: list[str]
) -> dict[str, Any]:
    first_slot_ms = int((time.time() + args.lead_s) * 1000)
    run_at, owner = await submit_delayed(cluster, args, movers, first_slot_ms)
    stop = asyncio.Event()
    watch = MoveWatch(cluster.database_url)
    probe = Probe(list(cluster.redis_urls))
    at_once: list[int] = []
    streams = [
        producer(cluster, loads[0], args.load_per_s, at_once, stop),
        producer(cluster, loads[1], args.load1_per_s, at_once, stop),
        unary_producer(cluster, loads[0], args.unary_per_s, at_once, stop),
        *(producer(cluster, t, args.busy_per_s, at_once, stop) for t in movers),
    ]
    tasks = [asyncio.create_task(watch.run(stop)), *(asyncio.create_task(s) for s in streams)]
    try:
        await move_in_turn(cluster, args, movers, first_slot_ms, watch, probe)
        await asyncio.sleep(1.0)  # the busy streams for a little after the last move
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    total = len(run_at) + len(at_once)
    await asyncio.sleep(max(0.0, max(run_at.values()) / 1000 - time.time()))
    deadline = time.monotonic() + args.timeout_s
    while len(read_starts(cluster.starts)) < total and time.monotonic() < deadline:
        cluster.check_alive()
        await asyncio.sleep(0.1)
    starts = read_starts(cluster.starts)
    lost = (set(run_at) | set(at_once)) - set(starts)
    moves: list[dict[str, Any]] = []
    every: list[float] = []
    controls: list[float] = []
    for tenant in movers:
        began, ended = watch.window(tenant)
        due = [n for n, t in run_at.items() if owner[n] == tenant and began <= t / 1000 <= ended]
        late = {n: starts[n] - run_at[n] / 1000 for n in due if n in starts}
        control = [
            starts[n] - t / 1000
            for n, t in run_at.items()
            if owner[n] == CONTROL and began <= t / 1000 <= ended and n in starts
        ]
        controls += control
        every += late.values()
        # The 5 latest, with how far into the move they were due.
        worst = sorted(late, key=late.__getitem__, reverse=True)[:5]
        moves.append({
            "tenant": tenant,
            "move_s": round(ended - began, 3),
            "copying_after_s": round(watch.copying.get(tenant, began) - began, 3),
            "due_in_move": len(due),
            "started": len(late),
            "lateness": summary_ms(list(late.values())) if late else {},
            "control_lateness": summary_ms(control) if control else {},
            "latest": [{"late_ms": round(late[n] * 1000, 1),
                        "due_s_into_move": round(run_at[n] / 1000 - began, 3)} for n in worst],
            "longest_due_wait_ms": probe.stretch.get(tenant, {}),
        })  # fmt: skip
    return {
        "lateness_due_in_move": summary_ms(every) if every else {},
        "due_in_move": len(every),
        "control_lateness_in_moves": summary_ms(controls) if controls else {},
        "moves": moves,
        "jobs": {"delayed": len(run_at), "at_once": len(at_once)},
        "lost": len(lost),
        "duplicates": duplicate_starts(cluster.starts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=700, help="delayed jobs per moving tenant")
    parser.add_argument("--slot-s", type=float, default=14.0, help="seconds between moves")
    parser.add_argument("--due-span-s", type=float, default=10.0)
    parser.add_argument("--lead-s", type=float, default=3.0)
    parser.add_argument("--load-per-s", type=float, default=100.0)
    parser.add_argument("--load1-per-s", type=float, default=50.0)
    parser.add_argument("--unary-per-s", type=float, default=300.0)
    parser.add_argument("--busy-per-s", type=float, default=30.0)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("BENCH_POSTGRES_URL", "postgresql://127.0.0.1:5432/postgres"),
    )
    parser.add_argument("--out", default="")
    parser.add_argument("--note", default="", help="what code was measured, kept in the JSON")
    args = parser.parse_args()
    info = {"commit": commit(), "note": args.note, "machine": machine()}
    runs = []
    for n in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="shardq-move-bench-") as workdir:
            result = run_once(args, workdir)
        runs.append(result)
        print(json.dumps({"run": n, **{k: result[k] for k in
              ("lateness_due_in_move", "due_in_move", "control_lateness_in_moves", "lost",
               "duplicates")},
              "moves_s": [m["move_s"] for m in result["moves"]]}), file=sys.stderr)  # fmt: skip
    out = {
        **info,
        "command": "python " + " ".join(sys.argv),
        "params": {k: v for k, v in vars(args).items() if k not in ("out", "postgres_url")},
        "setup": (
            f"2 redis-server shards, 1 shardq-shard loop each, 1 shardq-coordinator (runs the "
            f"moves), {WORKERS} shardq-worker processes, the local Postgres; every process on "
            "the same machine"
        ),
        "runs": runs,
    }
    text = json.dumps(out, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
