"""bench/capacity.py: the model's arithmetic on hand-made costs, the simulation against the
model, and the CLI on the reference costs file (docs/scaling.md quotes its output)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
REFERENCE = BENCH / "reference" / "2026-12-04-op-costs.json"


def _load() -> ModuleType:
    # bench/ holds scripts, not a package: load the file as a module of its own. Registered in
    # sys.modules first, as dataclasses look their module up while the class is made.
    spec = importlib.util.spec_from_file_location("bench_capacity", BENCH / "capacity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


capacity = _load()

#: Round numbers, so that every figure of the plan can be worked out by hand below.
COSTS = {
    "redis_enqueue_us": 20.0,
    "redis_enqueue_delayed_us": 40.0,
    "redis_promote_us": 10.0,
    "redis_claim_us": 30.0,
    "redis_ack_us": 10.0,
    "coordinator_unary_us": 600.0,
    "coordinator_batch_us": 60.0,
    "worker_us": 120.0,
    "shard_loop_us": 2.0,
    "pg_upsert_loaded_us": 30.0,
    "pg_check_loaded_us": 6.0,
    "pg_purge_us": 3.0,
    "pg_vacuum_us": 1.0,
    "pg_wal_bytes_per_row": 500.0,
    "pg_bytes_per_row": 400.0,
    "mem_finished_job_bytes": 500.0,
    "mem_dedupe_key_bytes": 200.0,
    "mem_scheduled_job_bytes": 700.0,
    "mem_idle_tenant_bytes": 400.0,
    "tenant_sample_redis_us": 5.0,
    "tenant_sample_loop_us": 50.0,
}


def params(**changes: float) -> object:
    base = {
        "tenants": 1_000_000,
        "delayed": 0.5,
        "delay_s": 60.0,
        "utilisation": 0.5,
        "redis_gb": 10.0,
        "dedupe_window_s": 3_600.0,
        "retention_s": 3_600.0,
        "result_retention_s": 86_400.0,
        "load_interval_s": 10.0,
        "pg_cores": 16,
        "pg_wal_mb_s": 100.0,
    }
    return capacity.Params(**{**base, **changes})


def test_redis_cost_per_job_sums_the_operations_on_its_path() -> None:
    # Half ready (enqueue 20), half delayed (enqueue 40 + promote 10); every job claim 30, ack 10.
    assert capacity.redis_us_per_job(COSTS, params()) == pytest.approx(0.5 * 20 + 0.5 * 50 + 40)
    assert capacity.redis_us_per_job(COSTS, params(delayed=0.0)) == pytest.approx(60)


def test_plan_sizes_every_resource_at_its_utilisation() -> None:
    pl = capacity.plan(COSTS, 100_000, params())
    # Redis: 100k × 75 µs + the sampler's 1M × 5 µs / 10 s = 8.0 s of Redis per s; at 50%: 16.
    assert pl.redis_us_per_job == pytest.approx(75)
    assert pl.sample_redis_us_per_s == pytest.approx(500_000)
    assert pl.shards_cpu == 16
    # Memory: finished 100k × 3,600 × 500 B = 180 GB; scheduled 100k × 0.5 × 60 × 700 B = 2.1
    # GB; tenants 1M × 400 B = 0.4 GB: 182.5 GB, 10 GB a shard: 19 shards.
    assert pl.redis_gb_total == pytest.approx(182.5)
    assert pl.shards_memory == 19
    assert pl.shards == 19
    assert pl.coordinator_cores_unary == 120  # 100k × 600 µs / 0.5
    assert pl.coordinator_cores_batch == 12
    assert pl.worker_cores == 24
    assert pl.pg_us_per_job == pytest.approx(40)
    assert pl.pg_cores == 8
    assert pl.pg_wal_mb_s == pytest.approx(50)
    assert (pl.pg_nodes_cpu, pl.pg_nodes_wal, pl.pg_nodes) == (1, 1, 1)
    assert pl.pg_rows_held == pytest.approx(100_000 * 86_400)
    assert pl.tenant_ceiling_jobs_per_s == pytest.approx(0.5e6 / 75)
    assert pl.slots_per_shard == pytest.approx(16_384 / 19)


def test_a_dedupe_window_longer_than_the_retention_keeps_only_the_dedupe_key() -> None:
    one_hour = capacity.redis_gb(COSTS, 1_000, params())
    longer = capacity.redis_gb(COSTS, 1_000, params(dedupe_window_s=7_200.0))
    key = "finished jobs (dedupe window, retention)"
    # The second hour holds the 200-byte dedupe key of each job, not the whole 500 bytes.
    assert longer[key] - one_hour[key] == pytest.approx(1_000 * 3_600 * 200 / 1e9)
    hashes = capacity.redis_gb(COSTS, 1_000, params(retention_s=7_200.0))
    assert hashes[key] - one_hour[key] == pytest.approx(1_000 * 3_600 * 300 / 1e9)


def test_postgres_nodes_follow_the_scarcer_of_cpu_and_wal() -> None:
    pl = capacity.plan(COSTS, 1_000_000, params())
    # CPU: 1M × 40 µs / 0.5 = 80 cores, 5 nodes of 16; WAL: 500 MB/s against 50 a node: 10.
    assert (pl.pg_cores, pl.pg_nodes_cpu, pl.pg_nodes_wal, pl.pg_nodes) == (80, 5, 10, 10)
    assert pl.pg_rows_per_s_one_node == pytest.approx(100e6 * 0.5 / 500)


def test_the_plan_names_what_saturates_first() -> None:
    pl = capacity.plan(COSTS, 100_000, params())
    first = pl.saturates_first[0]
    # One shard's 10 GB holds an hour of finished jobs of ~5,500 jobs/s, below one tenant's
    # ceiling (6,667) and one Postgres node (100,000).
    assert first.startswith("one shard's memory"), pl.saturates_first
    assert [s.split(":")[0] for s in pl.saturates_first[1:]] == [
        "one tenant",
        "one Postgres primary for every shard's result rows",
    ]


def test_the_simulation_finds_the_models_saturation_point() -> None:
    p = params()
    pl = capacity.plan(COSTS, 20_000, p)
    # A small cell, to keep the simulated event count low: its bottleneck is Redis.
    cell = capacity.cell_of(COSTS, pl, p)
    caps = cell.capacity()
    assert min(caps, key=lambda k: caps[k]) == "redis"
    found = capacity.check(COSTS, pl, p, seconds=0.5, seed=7, tolerance=0.05)
    assert found.bottleneck == "redis"
    assert found.ok, (found.sim_capacity, found.model_capacity)
    # Below saturation the cell keeps up; well past it a backlog builds.
    below = capacity.simulate(cell, 0.5 * found.model_capacity, 0.5, seed=7)
    above = capacity.simulate(cell, 1.5 * found.model_capacity, 0.5, seed=7)
    assert below.backlog_share < capacity.KEEPS_UP < above.backlog_share
    assert above.utilisation["redis"] == pytest.approx(1.0, abs=0.02)


def test_the_simulation_is_deterministic_for_a_seed() -> None:
    p = params()
    cell = capacity.cell_of(COSTS, capacity.plan(COSTS, 20_000, p), p)
    a, b = (capacity.simulate(cell, 3_000, 0.3, seed=3) for _ in range(2))
    assert a == b
    c = capacity.simulate(cell, 3_000, 0.3, seed=4)
    assert (a.arrived, a.p99_ms) != (c.arrived, c.p99_ms)
    assert not math.isnan(a.p99_ms)


def test_a_costs_file_without_a_required_cost_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "costs.json"
    costs = {k: {"value": v} for k, v in COSTS.items() if k != "worker_us"}
    path.write_text(json.dumps({"costs": costs}))
    with pytest.raises(ValueError, match="worker_us"):
        capacity.load_costs(path)


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = capacity.main(list(argv))
    return code, out.getvalue()


def test_the_cli_plans_from_the_reference_costs() -> None:
    code, text = _cli(str(REFERENCE), "--sim-seconds", "0.3", "--seed", "1")
    assert code == 0, text
    assert "100,000 jobs/s, 1,000,000 tenants" in text
    assert "1,000,000 jobs/s, 1,000,000 tenants" in text
    assert "(ok, ±5%)" in text
    code, md = _cli(str(REFERENCE), "--no-sim", "--markdown", "--targets", "100000")
    assert code == 0
    assert md.splitlines()[0].startswith("|  | 100,000 jobs/s")
    assert "| **shards** |" in md
    code, raw = _cli(str(REFERENCE), "--no-sim", "--json", "--targets", "1000")
    data = json.loads(raw)
    assert data["plans"][0]["rate"] == 1000
    assert data["checks"] == []
    again = json.loads(_cli(str(REFERENCE), "--no-sim", "--json", "--targets", "1000")[1])
    assert again == data
