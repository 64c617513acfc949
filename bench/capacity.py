"""How many shards, coordinators, workers and Postgres nodes a target rate needs: a model
from measured per-operation costs, and a discrete-event simulation that checks it.

    python bench/capacity.py bench/reference/2026-12-04-op-costs.json
    python bench/capacity.py bench/reference/2026-12-04-op-costs.json --markdown
    python bench/capacity.py COSTS.json --targets 100000 1000000 --tenants 1000000 --json

The costs come from ``bench/op_costs.py`` (a JSON file; each cost's ``value``). Standard
library only. ``docs/scaling.md`` explains the model and its assumptions.

**The model** (:func:`plan`), for a target of R jobs/s and T tenants, each resource sized to
run at ``--utilisation`` (default 60%) of its capacity:

- Redis (one single-threaded ``redis-server`` per shard): CPU per job = enqueue + claim + ack
  (+ promote, and the delayed enqueue instead of the ready one, for the ``--delayed``
  share), plus the load sampler's pass over every tenant every ``--load-interval-s``;
  memory = finished jobs held for the dedupe window and the retention, scheduled jobs, idle
  tenants. Shards = the larger of the CPU and the memory count.
- coordinators, workers: cores = R × CPU per job / utilisation (one process per core).
- Postgres (shared by every shard): backend CPU per job = upsert + already-done check +
  purge + vacuum of the expired row, WAL per row against ``--pg-wal-mb-s``, rows held for the
  result retention.

**The simulation** (:func:`simulate`) runs one shard's cell — its Redis and its share of the
coordinator, worker and Postgres cores — as queues with Poisson arrivals and the measured
service times, and finds by bisection the highest arrival rate the cell keeps up with. It
must land within ``--tolerance`` of the model's capacity for that cell (:func:`check`).
Deterministic for a given ``--seed``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The costs the model reads (names of bench/op_costs.py's JSON), µs per job unless named.
REQUIRED = (
    "redis_enqueue_us",
    "redis_enqueue_delayed_us",
    "redis_promote_us",
    "redis_claim_us",
    "redis_ack_us",
    "coordinator_unary_us",
    "coordinator_batch_us",
    "worker_us",
    "shard_loop_us",
    "pg_upsert_loaded_us",
    "pg_check_loaded_us",
    "pg_purge_us",
    "pg_vacuum_us",
    "pg_wal_bytes_per_row",
    "pg_bytes_per_row",
    "mem_finished_job_bytes",
    "mem_dedupe_key_bytes",
    "mem_scheduled_job_bytes",
    "mem_idle_tenant_bytes",
    "tenant_sample_redis_us",
    "tenant_sample_loop_us",
)
#: Fixed slots of the placement rule (shardq.common.placement.SLOT_COUNT): a shard owns at
#: least one, so there can never be more shards than this.
SLOT_COUNT = 16_384
GB = 1e9


@dataclass(frozen=True)
class Params:
    """What the model is asked, and the assumptions that are not measurements."""

    tenants: int = 1_000_000
    #: Share of jobs submitted with a delay (they are promoted before they are claimed).
    delayed: float = 0.25
    #: How long a delayed job waits on average (scheduled memory), s.
    delay_s: float = 60.0
    #: Target utilisation of every resource (headroom for bursts, failover, GC).
    utilisation: float = 0.6
    #: Usable Redis memory per shard (maxmemory on a host with room for a fork), GB.
    redis_gb: float = 25.0
    #: How long a finished job's dedupe key and its job hash stay in Redis, s.
    dedupe_window_s: float = 86_400.0
    retention_s: float = 86_400.0
    #: How long result rows stay in Postgres (the purge's --result-retention-s), s.
    result_retention_s: float = 7 * 86_400.0
    #: The shard loop samples every tenant this often (SHARDQ_LOAD_INTERVAL_S).
    load_interval_s: float = 10.0
    #: Cores of one Postgres node, and the WAL one primary sustains (fsync, replication), MB/s.
    pg_cores: int = 32
    pg_wal_mb_s: float = 250.0


@dataclass
class Plan:
    """The model's answer for one target rate."""

    rate: float
    tenants: int
    redis_us_per_job: float
    sample_redis_us_per_s: float
    shards_cpu: int
    shards_memory: int
    shards: int
    redis_gb_total: float
    redis_gb_by_part: dict[str, float]
    shard_utilisation: float
    shard_capacity_jobs_per_s: float
    shard_loop_utilisation: float
    coordinator_cores_unary: int
    coordinator_cores_batch: int
    worker_cores: int
    #: Worker cores at the cost of jobs that trickle in one by one (claims of a few jobs).
    worker_cores_trickle: int
    pg_us_per_job: float
    pg_cores: int
    pg_nodes_cpu: int
    pg_wal_mb_s: float
    pg_nodes_wal: int
    pg_nodes: int
    pg_rows_per_s_one_node: float
    pg_rows_held: float
    pg_tb_held: float
    tenants_per_shard: float
    slots_per_shard: float
    tenant_ceiling_jobs_per_s: float
    saturates_first: list[str] = field(default_factory=list)


def load_costs(path: str | Path) -> dict[str, float]:
    """The ``value`` of every cost in an op-costs JSON file, plus its dedupe window and
    retention (as ``dedupe_window_s`` / ``retention_s``)."""
    data = json.loads(Path(path).read_text())
    costs = {name: float(c["value"]) for name, c in data["costs"].items()}
    finished = data["costs"].get("mem_finished_job_bytes", {})
    for key in ("dedupe_window_s", "retention_s"):
        if key in finished:
            costs[key] = float(finished[key])
    missing = [k for k in REQUIRED if k not in costs]
    if missing:
        raise ValueError(f"{path}: costs missing: {', '.join(missing)}")
    return costs


def redis_us_per_job(c: Mapping[str, float], p: Params) -> float:
    """redis-server CPU one job costs its shard, on the way from submit to ack."""
    enqueue = (1 - p.delayed) * c["redis_enqueue_us"] + p.delayed * (
        c["redis_enqueue_delayed_us"] + c["redis_promote_us"]
    )
    return enqueue + c["redis_claim_us"] + c["redis_ack_us"]


def pg_us_per_job(c: Mapping[str, float]) -> float:
    """Postgres backend CPU per job: its row, its already-done check, and deleting the row
    again when it expires (the purge, then the VACUUM that reclaims it)."""
    return c["pg_upsert_loaded_us"] + c["pg_check_loaded_us"] + c["pg_purge_us"] + c["pg_vacuum_us"]


def redis_gb(c: Mapping[str, float], rate: float, p: Params) -> dict[str, float]:
    """Redis memory in steady state, GB, by what holds it."""
    both = min(p.dedupe_window_s, p.retention_s)
    if p.dedupe_window_s >= p.retention_s:  # the dedupe key outlives the job hash
        tail = (p.dedupe_window_s - both) * c["mem_dedupe_key_bytes"]
    else:  # the job hash outlives the dedupe key
        tail = (p.retention_s - both) * (c["mem_finished_job_bytes"] - c["mem_dedupe_key_bytes"])
    return {
        "finished jobs (dedupe window, retention)": rate
        * (both * c["mem_finished_job_bytes"] + tail)
        / GB,
        "scheduled jobs": rate * p.delayed * p.delay_s * c["mem_scheduled_job_bytes"] / GB,
        "idle tenants": p.tenants * c["mem_idle_tenant_bytes"] / GB,
    }


def ceil_div(a: float, b: float) -> int:
    return max(1, math.ceil(a / b - 1e-9))


def plan(c: Mapping[str, float], rate: float, p: Params | None = None) -> Plan:
    """Size every resource for ``rate`` jobs/s (see the module's docstring)."""
    p = p or Params()
    u = p.utilisation
    r = redis_us_per_job(c, p)
    # The load sampler reads every tenant of a shard once per interval: spread over shards,
    # it costs the fleet T × µs / interval of Redis time per second, whatever the job rate.
    sample = p.tenants * c["tenant_sample_redis_us"] / p.load_interval_s
    shards_cpu = ceil_div(rate * r + sample, u * 1e6)
    mem = redis_gb(c, rate, p)
    total_gb = sum(mem.values())
    shards_mem = ceil_div(total_gb, p.redis_gb)
    shards = max(shards_cpu, shards_mem)
    per_shard_rate = rate / shards
    shard_util = (per_shard_rate * r + sample / shards) / 1e6
    loop_util = (
        per_shard_rate * c["shard_loop_us"]
        + p.tenants / shards * c["tenant_sample_loop_us"] / p.load_interval_s
    ) / 1e6
    pg = pg_us_per_job(c)
    pg_cores = ceil_div(rate * pg, u * 1e6)
    wal = rate * c["pg_wal_bytes_per_row"] / 1e6
    pg_nodes_cpu = ceil_div(pg_cores, p.pg_cores)
    pg_nodes_wal = ceil_div(wal, p.pg_wal_mb_s * u)
    one_node = min(p.pg_cores * u * 1e6 / pg, p.pg_wal_mb_s * u * 1e6 / c["pg_wal_bytes_per_row"])
    rows_held = rate * p.result_retention_s
    out = Plan(
        rate=rate,
        tenants=p.tenants,
        redis_us_per_job=r,
        sample_redis_us_per_s=sample,
        shards_cpu=shards_cpu,
        shards_memory=shards_mem,
        shards=shards,
        redis_gb_total=total_gb,
        redis_gb_by_part=mem,
        shard_utilisation=shard_util,
        shard_capacity_jobs_per_s=(1e6 - sample / shards) / r,
        shard_loop_utilisation=loop_util,
        coordinator_cores_unary=ceil_div(rate * c["coordinator_unary_us"], u * 1e6),
        coordinator_cores_batch=ceil_div(rate * c["coordinator_batch_us"], u * 1e6),
        worker_cores=ceil_div(rate * c["worker_us"], u * 1e6),
        worker_cores_trickle=ceil_div(rate * c.get("worker_trickle_us", c["worker_us"]), u * 1e6),
        pg_us_per_job=pg,
        pg_cores=pg_cores,
        pg_nodes_cpu=pg_nodes_cpu,
        pg_wal_mb_s=wal,
        pg_nodes_wal=pg_nodes_wal,
        pg_nodes=max(pg_nodes_cpu, pg_nodes_wal),
        pg_rows_per_s_one_node=one_node,
        pg_rows_held=rows_held,
        pg_tb_held=rows_held * c["pg_bytes_per_row"] / 1e12,
        tenants_per_shard=p.tenants / shards,
        slots_per_shard=SLOT_COUNT / shards,
        # A tenant lives on one shard: its rate can never pass one shard's.
        tenant_ceiling_jobs_per_s=u * 1e6 / r,
    )
    out.saturates_first = saturation_order(out, p)
    return out


def saturation_order(pl: Plan, p: Params) -> list[str]:
    """What a single instance of each shared or per-tenant resource holds, lowest first:
    the first of these is where this rate stops fitting a scale-out by more of the same."""
    limits = [
        (pl.tenant_ceiling_jobs_per_s, "one tenant: one shard's Redis (a tenant is never split)"),
        (pl.pg_rows_per_s_one_node, "one Postgres primary for every shard's result rows"),
        (
            p.redis_gb * 1e9 / max(1.0, pl.redis_gb_total * 1e9 / pl.rate),
            f"one shard's memory ({p.redis_gb:g} GB): the finished jobs of the dedupe window "
            "and retention",
        ),
    ]
    return [f"{what}: {value:,.0f} jobs/s" for value, what in sorted(limits)]


# --- the simulation ----------------------------------------------------------------------------


class Station:
    """``servers`` identical servers in front of one FIFO queue; records busy time."""

    def __init__(self, sim: Sim, name: str, servers: int) -> None:
        self.sim, self.name, self.servers = sim, name, servers
        self.free = servers
        self.queue: deque[tuple[float, Callable[[], None]]] = deque()
        self.busy_s = 0.0

    def request(self, service_s: float, then: Callable[[], None]) -> None:
        if self.free:
            self._start(service_s, then)
        else:
            self.queue.append((service_s, then))

    def _start(self, service_s: float, then: Callable[[], None]) -> None:
        self.free -= 1
        self.busy_s += service_s

        def done() -> None:
            self.free += 1
            if self.queue:
                self._start(*self.queue.popleft())
            then()

        self.sim.at(self.sim.now + service_s, done)


class Sim:
    """A minimal discrete-event loop: callbacks at times, in time order (ties by order)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0

    def at(self, t: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, fn))

    def run(self, until: float) -> None:
        while self._events and self._events[0][0] <= until:
            t, _, fn = heapq.heappop(self._events)
            self.now = t
            fn()
        self.now = until


@dataclass(frozen=True)
class Cell:
    """One shard's cell: its Redis (1 server) and its share of the other stages' cores."""

    coordinators: int
    workers: int
    postgres: int
    #: µs per job at each stage (Redis: per visit).
    coordinator_us: float
    worker_us: float
    pg_us: float
    enqueue_us: float
    enqueue_delayed_us: float
    promote_us: float
    claim_us: float
    ack_us: float
    delayed: float
    #: The load sampler's Redis time per second on this shard, run in chunks.
    sample_us_per_s: float = 0.0
    sample_chunk_us: float = 0.0

    def capacity(self) -> dict[str, float]:
        """Jobs/s each stage of the cell serves when busy all the time (the model's view)."""
        redis = (1 - self.delayed) * self.enqueue_us + self.delayed * (
            self.enqueue_delayed_us + self.promote_us
        )
        redis += self.claim_us + self.ack_us
        return {
            "coordinator": self.coordinators * 1e6 / self.coordinator_us,
            "redis": (1e6 - self.sample_us_per_s) / redis,
            "worker": self.workers * 1e6 / self.worker_us,
            "postgres": self.postgres * 1e6 / self.pg_us,
        }


def cell_of(c: Mapping[str, float], pl: Plan, p: Params, unary: bool = False) -> Cell:
    """One shard's cell as the plan's CPU sizes it: every stage's cores divided by the shards
    Redis CPU asks for (``shards_cpu``), rounded up. Shards added for memory only spread the
    same load thinner; the cell of a CPU-sized shard is the one that runs hottest."""
    coord = pl.coordinator_cores_unary if unary else pl.coordinator_cores_batch
    shards = pl.shards_cpu
    tenants_per_shard = p.tenants / shards
    chunk = min(500.0, tenants_per_shard)  # the sampler's pipelined chunks (max_batch)
    return Cell(
        coordinators=math.ceil(coord / shards),
        workers=math.ceil(pl.worker_cores / shards),
        postgres=math.ceil(pl.pg_cores / shards),
        coordinator_us=c["coordinator_unary_us" if unary else "coordinator_batch_us"],
        worker_us=c["worker_us"],
        pg_us=pl.pg_us_per_job,
        enqueue_us=c["redis_enqueue_us"],
        enqueue_delayed_us=c["redis_enqueue_delayed_us"],
        promote_us=c["redis_promote_us"],
        claim_us=c["redis_claim_us"],
        ack_us=c["redis_ack_us"],
        delayed=p.delayed,
        sample_us_per_s=pl.sample_redis_us_per_s / shards,
        sample_chunk_us=chunk * c["tenant_sample_redis_us"],
    )


@dataclass
class SimRun:
    offered: float
    arrived: int
    completed: int
    throughput: float
    backlog_share: float
    utilisation: dict[str, float]
    p50_ms: float
    p99_ms: float


class _Run:
    """One simulation: the cell's stations, the arrivals, and what finished when."""

    def __init__(self, cell: Cell, rate: float, seed: int) -> None:
        self.cell, self.rate = cell, rate
        self.rng = random.Random(seed)
        self.sim = Sim()
        self.coord = Station(self.sim, "coordinator", cell.coordinators)
        self.redis = Station(self.sim, "redis", 1)
        self.worker = Station(self.sim, "worker", cell.workers)
        self.pg = Station(self.sim, "postgres", cell.postgres)
        self.arrived = 0
        self.sojourn: list[float] = []

    def svc(self, us: float) -> float:
        """A service time of mean ``us``, exponentially distributed (a mix of batch sizes,
        payloads and machine noise around the measured mean)."""
        return self.rng.expovariate(1e6 / us) if us > 0 else 0.0

    def job(self) -> None:
        """coordinator → Redis (enqueue; a delayed job is promoted as soon as it is due, so
        only its Redis work counts) → Redis (claim) → worker → Postgres (row) → Redis (ack)."""
        c, born = self.cell, self.sim.now
        self.arrived += 1
        delayed = self.rng.random() < c.delayed
        steps: list[tuple[Station, float]] = [
            (self.coord, c.coordinator_us),
            (self.redis, c.enqueue_delayed_us if delayed else c.enqueue_us),
            *([(self.redis, c.promote_us)] if delayed else []),
            (self.redis, c.claim_us),
            (self.worker, c.worker_us),
            (self.pg, c.pg_us),
            (self.redis, c.ack_us),
        ]
        path = iter(steps)

        def advance() -> None:
            step = next(path, None)
            if step is None:
                self.sojourn.append(self.sim.now - born)
            else:
                step[0].request(self.svc(step[1]), advance)

        advance()

    def arrivals(self) -> None:
        self.job()
        self.sim.at(self.sim.now + self.rng.expovariate(self.rate), self.arrivals)

    def sampler(self) -> None:
        """The load sampler's chunks on Redis, spread evenly over its interval."""
        c = self.cell
        self.redis.request(c.sample_chunk_us / 1e6, lambda: None)
        self.sim.at(self.sim.now + c.sample_chunk_us / c.sample_us_per_s, self.sampler)

    def run(self, seconds: float) -> SimRun:
        self.sim.at(self.rng.expovariate(self.rate), self.arrivals)
        if self.cell.sample_us_per_s > 0 and self.cell.sample_chunk_us > 0:
            self.sim.at(0.0, self.sampler)
        self.sim.run(seconds)
        done = sorted(self.sojourn)
        stations = (self.coord, self.redis, self.worker, self.pg)
        return SimRun(
            offered=self.rate,
            arrived=self.arrived,
            completed=len(done),
            throughput=len(done) / seconds,
            backlog_share=(self.arrived - len(done)) / max(1, self.arrived),
            utilisation={s.name: min(1.0, s.busy_s / seconds / s.servers) for s in stations},
            p50_ms=done[len(done) // 2] * 1e3 if done else math.nan,
            p99_ms=done[int(len(done) * 0.99)] * 1e3 if done else math.nan,
        )


def simulate(cell: Cell, rate: float, seconds: float, seed: int) -> SimRun:
    """Poisson arrivals at ``rate`` jobs/s into ``cell`` for ``seconds`` of simulated time,
    each job along :meth:`_Run.job`'s path, with the measured mean service times."""
    return _Run(cell, rate, seed).run(seconds)


#: A cell "keeps up" while fewer than this share of the jobs that arrived are unfinished at
#: the end (in flight or queued): past saturation the backlog grows with time.
KEEPS_UP = 0.02


def saturation(cell: Cell, seconds: float, seed: int, steps: int = 8) -> float:
    """The highest arrival rate the simulated cell keeps up with, by bisection between half
    and twice the model's capacity (the same seed for every probe)."""
    model = min(cell.capacity().values())
    lo, hi = 0.5 * model, 2.0 * model
    for _ in range(steps):
        mid = (lo + hi) / 2
        if simulate(cell, mid, seconds, seed).backlog_share <= KEEPS_UP:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Check:
    """The simulation against the model, for one plan's cell."""

    cell: dict[str, Any]
    model_capacity: float
    bottleneck: str
    sim_capacity: float
    error: float
    tolerance: float
    ok: bool
    at_target: dict[str, Any]


def check(
    c: Mapping[str, float],
    pl: Plan,
    p: Params,
    seconds: float = 1.0,
    seed: int = 1,
    tolerance: float = 0.05,
    unary: bool = False,
) -> Check:
    cell = cell_of(c, pl, p, unary)
    caps = cell.capacity()
    bottleneck = min(caps, key=lambda k: caps[k])
    sim_cap = saturation(cell, seconds, seed)
    err = sim_cap / caps[bottleneck] - 1
    at = simulate(cell, pl.rate / pl.shards_cpu, seconds, seed)
    return Check(
        cell=asdict(cell),
        model_capacity=caps[bottleneck],
        bottleneck=bottleneck,
        sim_capacity=sim_cap,
        error=err,
        tolerance=tolerance,
        ok=abs(err) <= tolerance,
        at_target={
            "rate_per_shard": pl.rate / pl.shards_cpu,
            "utilisation": {k: round(v, 3) for k, v in at.utilisation.items()},
            "p50_ms": round(at.p50_ms, 3),
            "p99_ms": round(at.p99_ms, 3),
            "backlog_share": round(at.backlog_share, 4),
        },
    )


# --- output ------------------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def rows(plans: Sequence[Plan], checks: Sequence[Check]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = [
        ("Redis CPU per job (µs)", [_n(p.redis_us_per_job) for p in plans]),
        ("load sampler, Redis µs per s (all shards)", [_n(p.sample_redis_us_per_s) for p in plans]),
        ("shards for Redis CPU", [_n(p.shards_cpu) for p in plans]),
        ("Redis memory, GB (all shards)", [_n(p.redis_gb_total) for p in plans]),
        ("shards for Redis memory", [_n(p.shards_memory) for p in plans]),
        ("**shards**", [f"**{_n(p.shards)}**" for p in plans]),
        ("one shard's Redis busy", [f"{p.shard_utilisation:.0%}" for p in plans]),
        ("one shard's loop busy (of a core)", [f"{p.shard_loop_utilisation:.0%}" for p in plans]),
        ("tenants per shard", [_n(p.tenants_per_shard) for p in plans]),
        ("slots per shard (of 16,384)", [_n(p.slots_per_shard) for p in plans]),
        (
            "**coordinator cores, unary SubmitJob**",
            [f"**{_n(p.coordinator_cores_unary)}**" for p in plans],
        ),
        (
            "**coordinator cores, SubmitJobs of 100**",
            [f"**{_n(p.coordinator_cores_batch)}**" for p in plans],
        ),
        ("**worker cores**", [f"**{_n(p.worker_cores)}**" for p in plans]),
        ("worker cores, jobs trickling in one by one", [_n(p.worker_cores_trickle) for p in plans]),
        ("Postgres CPU per job (µs)", [_n(p.pg_us_per_job) for p in plans]),
        ("**Postgres cores**", [f"**{_n(p.pg_cores)}**" for p in plans]),
        ("Postgres WAL, MB/s", [_n(p.pg_wal_mb_s) for p in plans]),
        (
            "**Postgres primaries** (CPU / WAL)",
            [f"**{p.pg_nodes}** ({p.pg_nodes_cpu} / {p.pg_nodes_wal})" for p in plans],
        ),
        ("result rows held", [_n(p.pg_rows_held) for p in plans]),
        ("result rows held, TB", [_n(p.pg_tb_held) for p in plans]),
        ("one tenant's ceiling (jobs/s)", [_n(p.tenant_ceiling_jobs_per_s) for p in plans]),
    ]
    if checks:
        out += [
            (
                "simulated cell (one CPU-sized shard): servers",
                [
                    f"{c.cell['coordinators']} coord, 1 Redis, {c.cell['workers']} worker, "
                    f"{c.cell['postgres']} pg"
                    for c in checks
                ],
            ),
            ("simulated cell: bottleneck", [c.bottleneck for c in checks]),
            ("cell capacity, model (jobs/s)", [_n(c.model_capacity) for c in checks]),
            ("cell capacity, simulation (jobs/s)", [_n(c.sim_capacity) for c in checks]),
            (
                "simulation / model − 1",
                [f"{c.error:+.1%} ({'ok' if c.ok else 'OFF'}, ±{c.tolerance:.0%})" for c in checks],
            ),
            (
                "cell at its share of the target: Redis busy (sim)",
                [f"{c.at_target['utilisation']['redis']:.0%}" for c in checks],
            ),
            (
                "cell at its share: p50 / p99 submit→ack (ms)",
                [f"{c.at_target['p50_ms']:.2f} / {c.at_target['p99_ms']:.2f}" for c in checks],
            ),
        ]
    return out


def render(plans: Sequence[Plan], checks: Sequence[Check], markdown: bool) -> str:
    head = ["", *(f"{p.rate:,.0f} jobs/s, {p.tenants:,} tenants" for p in plans)]
    body = rows(plans, checks)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join([name, *cells]) + " |" for name, cells in body]
        first = [f"- {p.rate:,.0f} jobs/s: " + "; ".join(p.saturates_first) for p in plans]
        return "\n".join([*lines, "", "One instance's ceiling, lowest first:", *first])
    plain = [(name.replace("**", ""), [x.replace("**", "") for x in cells]) for name, cells in body]
    width = max(len(name) for name, _ in plain)
    cols = [max(len(h), *(len(cells[i]) for _, cells in plain)) for i, h in enumerate(head[1:])]
    lines = [
        f"{'':{width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(head[1:], cols, strict=True))
    ]
    for name, cells in plain:
        shown = "  ".join(f"{x:>{w}}" for x, w in zip(cells, cols, strict=True))
        lines.append(f"{name:{width}}  {shown}")
    for p in plans:
        lines.append(f"\n{p.rate:,.0f} jobs/s, one instance's ceiling, lowest first:")
        lines += [f"  {s}" for s in p.saturates_first]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("costs", help="an op-costs JSON file (bench/op_costs.py)")
    ap.add_argument("--targets", type=float, nargs="+", default=[100_000, 1_000_000])
    d = Params()
    ap.add_argument("--tenants", type=int, default=d.tenants)
    ap.add_argument("--delayed", type=float, default=d.delayed, help="share of delayed jobs")
    ap.add_argument("--delay-s", type=float, default=d.delay_s)
    ap.add_argument("--utilisation", type=float, default=d.utilisation)
    ap.add_argument("--redis-gb", type=float, default=d.redis_gb, help="usable per shard")
    ap.add_argument("--dedupe-window-s", type=float, help="default: the costs file's")
    ap.add_argument("--retention-s", type=float, help="finished job hashes; default: the file's")
    ap.add_argument("--result-retention-s", type=float, default=d.result_retention_s)
    ap.add_argument("--load-interval-s", type=float, default=d.load_interval_s)
    ap.add_argument("--pg-cores", type=int, default=d.pg_cores, help="cores per Postgres node")
    ap.add_argument("--pg-wal-mb-s", type=float, default=d.pg_wal_mb_s)
    ap.add_argument("--sim-seconds", type=float, default=1.0, help="simulated time per probe")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--no-sim", action="store_true", help="the model alone")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    costs = load_costs(a.costs)
    p = Params(
        tenants=a.tenants,
        delayed=a.delayed,
        delay_s=a.delay_s,
        utilisation=a.utilisation,
        redis_gb=a.redis_gb,
        dedupe_window_s=a.dedupe_window_s or costs.get("dedupe_window_s", d.dedupe_window_s),
        retention_s=a.retention_s or costs.get("retention_s", d.retention_s),
        result_retention_s=a.result_retention_s,
        load_interval_s=a.load_interval_s,
        pg_cores=a.pg_cores,
        pg_wal_mb_s=a.pg_wal_mb_s,
    )
    plans = [plan(costs, rate, p) for rate in a.targets]
    checks = (
        []
        if a.no_sim
        else [check(costs, pl, p, a.sim_seconds, a.seed, a.tolerance) for pl in plans]
    )
    if a.json:
        print(
            json.dumps(
                {
                    "params": asdict(p),
                    "plans": [asdict(x) for x in plans],
                    "checks": [asdict(x) for x in checks],
                },
                indent=1,
            )
        )
    else:
        print(render(plans, checks, a.markdown))
    return 0 if all(x.ok for x in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
