"""The benchmark's smoke run (``bench/smoke.py``), so the harness cannot rot unnoticed.

``run.py --quick`` for rq (its venv is made under bench/.venvs/ from PyPI on first use) and for
shardq at its defaults and tuned (a real cluster per scenario: Redis, Postgres, coordinator,
shard loops, workers), then the shape of the JSON — the commit, the machine and its yardstick,
each run's tuning and processes — and that every shardq figure is a number. Tiny counts: a
check that it runs and reports, not a measurement (no timing is asserted).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.postgres import admin_url

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load_smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_smoke", BENCH / "smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~2 min on 2 cores (shardq twice), plus rq's one-time pip install
def test_quick_benchmark_runs_and_reports_every_figure(tmp_path: Path) -> None:
    result = _load_smoke().smoke(tmp_path, timeout=540)
    for system in ("shardq-tuned", "shardq-defaults"):
        shardq = [r for r in result["runs"] if r["system"] == system]
        assert {r["scenario"] for r in shardq} == set(result["scenarios"]), system
        assert all(r["status"] == "ok" for r in shardq), shardq


@pytest.mark.timeout(300)
def test_the_coordinator_processes_benchmark_runs_and_reports_both_figures() -> None:
    """``bench/coordinator_processes.py`` at its smallest: both settings report a rate and a
    CPU cost (not a measurement: nothing about their values is asserted but that they exist)."""
    env = {**os.environ, "BENCH_POSTGRES_URL": admin_url()}  # the tests' Postgres, wherever
    done = subprocess.run(
        [sys.executable, str(BENCH / "coordinator_processes.py"), "--seconds", "1",
         "--repeat", "1", "--producers", "1", "--in-flight", "4"],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for n in (1, 2):
        figures = report[f"processes_{n}"]
        assert figures["jobs_per_s"] > 0 and figures["coordinator_cpu_us_per_call"] > 0


@pytest.mark.timeout(300)
def test_the_move_lateness_benchmark_runs_with_its_control_tenant() -> None:
    """``bench/move_lateness.py`` at its smallest (one tenant moved, short slots): it reports
    the move's lateness beside the control tenant's, and loses and repeats no job (the run's
    counts are asserted; the lateness figures only exist)."""
    env = {**os.environ, "BENCH_POSTGRES_URL": admin_url()}
    done = subprocess.run(
        [sys.executable, str(BENCH / "move_lateness.py"), "--tenants", "1", "--jobs", "20",
         "--slot-s", "3", "--due-span-s", "3", "--lead-s", "2", "--load-per-s", "10",
         "--load1-per-s", "10", "--unary-per-s", "10", "--busy-per-s", "10"],
        capture_output=True, text=True, timeout=240, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = json.loads(done.stdout)["runs"]
    assert (run["lost"], run["duplicates"]) == (0, 0)
    # Every tenant's delayed jobs, due over the whole run: 20 per 3 s over (1 + 1) slots of 3 s.
    assert run["jobs"]["delayed"] == 2 * 40
    (move,) = run["moves"]
    assert move["tenant"] == "move-0" and move["move_s"] > 0
    assert set(move) >= {"lateness", "control_lateness", "longest_due_wait_ms"}
