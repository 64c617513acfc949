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
from typing import Any

import pytest

from tests.support.postgres import admin_url

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(script: str, *args: str, timeout: int = 100, postgres: bool = False) -> str:
    """``bench/<script> <args>`` run by this interpreter (``postgres``: on the tests' Postgres,
    wherever it is); its standard output. Fails the test where the script fails."""
    env = {**os.environ, "BENCH_POSTGRES_URL": admin_url()} if postgres else None
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True, text=True, timeout=timeout, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _bench_json(tmp_path: Path, script: str, *args: str, **options: Any) -> Any:
    """The JSON file ``bench/<script> <args> --out FILE`` writes."""
    out = tmp_path / f"{Path(script).stem}.json"
    _bench(script, *args, "--out", str(out), **options)
    return json.loads(out.read_text())


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
    stdout = _bench(
        "coordinator_processes.py", "--seconds", "1", "--repeat", "1", "--producers", "1",
        "--in-flight", "4", timeout=240, postgres=True,
    )  # fmt: skip
    report = json.loads(stdout)
    for n in (1, 2):
        figures = report[f"processes_{n}"]
        assert figures["jobs_per_s"] > 0 and figures["coordinator_cpu_us_per_call"] > 0


@pytest.mark.timeout(300)
def test_the_coordinator_processes_benchmark_alternates_event_loops_with_batches(
    tmp_path: Path,
) -> None:
    """With ``--event-loops``, one figure per loop, in the JSON file ``--out`` names too; with
    ``--batch``, each call a SubmitJobs of that many jobs, the CPU given per call and per job,
    and the shard's CPU and script time per job."""
    report = _bench_json(
        tmp_path, "coordinator_processes.py", "--seconds", "1", "--repeat", "1",
        "--producers", "1", "--in-flight", "4", "--processes", "1",
        "--event-loops", "uvloop", "asyncio", "--batch", "10", timeout=240, postgres=True,
    )  # fmt: skip
    assert {k for k in report if k.startswith("processes_")} == {
        "processes_1_uvloop",
        "processes_1_asyncio",
    }
    assert report["config"]["batch"] == 10
    for key in ("processes_1_uvloop", "processes_1_asyncio"):
        per_call, per_job = (report[key][f"coordinator_cpu_us_per_{k}"] for k in ("call", "job"))
        assert per_job > 0
        assert per_call == pytest.approx(per_job * 10, abs=1.0)
        # The shard's side: its process's CPU and its time inside the scripts, per job.
        assert report[key]["redis_cpu_us_per_job"] > 0
        assert report[key]["redis_script_us_per_job"] > 0


@pytest.mark.timeout(300)
def test_the_move_lateness_benchmark_runs_with_its_control_tenant() -> None:
    """``bench/move_lateness.py`` at its smallest (one tenant moved, short slots): it reports
    the move's lateness beside the control tenant's, and loses and repeats no job (the run's
    counts are asserted; the lateness figures only exist)."""
    stdout = _bench(
        "move_lateness.py", "--tenants", "1", "--jobs", "20", "--slot-s", "3",
        "--due-span-s", "3", "--lead-s", "2", "--load-per-s", "10", "--load1-per-s", "10",
        "--unary-per-s", "10", "--busy-per-s", "10", timeout=240, postgres=True,
    )  # fmt: skip
    (run,) = json.loads(stdout)["runs"]
    assert (run["lost"], run["duplicates"]) == (0, 0)
    # Every tenant's delayed jobs, due over the whole run: 20 per 3 s over (1 + 1) slots of 3 s.
    assert run["jobs"]["delayed"] == 2 * 40
    (move,) = run["moves"]
    assert move["tenant"] == "move-0" and move["move_s"] > 0
    assert set(move) >= {"lateness", "control_lateness", "longest_due_wait_ms"}


@pytest.mark.timeout(120)
def test_the_submit_stages_benchmark_times_every_stage(tmp_path: Path) -> None:
    """``bench/submit_stages.py`` with one round: a figure per stage of the coordinator's
    per-job work, the client's ``job_spec`` and a unary SubmitJob's answer (that they exist,
    not what they are); the total is the SubmitJobs stages' alone."""
    results = _bench_json(tmp_path, "submit_stages.py", "--rounds", "1")["results"]
    stages = ["new_job", "prepare", "to_argv", "pack", "from_reply", "submitted", "answer"]
    assert list(results) == [*stages, "unary_answer", "coordinator_total", "client_job_spec"]
    assert all(results[name] > 0 for name in results)
    assert results["coordinator_total"] == pytest.approx(sum(results[s] for s in stages), abs=0.01)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("loops", [[], ["uvloop", "asyncio"]])
def test_the_grpc_floor_benchmark_reports_each_server_shape(
    tmp_path: Path, loops: list[str]
) -> None:
    """``bench/grpc_floor.py`` at its smallest: a server CPU figure and a rate for each of the
    four shapes of server (unary or request-streaming, with 0 or 2 interceptors), on each
    event loop ``--event-loops`` names."""
    results = _bench_json(
        tmp_path, "grpc_floor.py", "--calls", "200", "--in-flight", "8", "--rounds", "1",
        *(["--event-loops", *loops] if loops else []), timeout=180,
    )["results"]  # fmt: skip
    assert set(results) == {
        f"{kind}/{n}_interceptors" + (f"/{loop}" if loop else "")
        for kind in ("unary", "request_streaming")
        for n in (0, 2)
        for loop in loops or [""]
    }
    for figures in results.values():
        assert figures["calls_per_s"] > 0 and figures["server_cpu_us_per_call"] >= 0


@pytest.mark.timeout(120)
def test_the_key_table_benchmark_loads_on_either_side_of_other_keys(tmp_path: Path) -> None:
    """``bench/key_table.py`` at its smallest: two loads, the second after the other keys,
    each with its bytes per job and the key table's share of them."""
    report = _bench_json(tmp_path, "key_table.py", "--jobs", "2000", "--keys-before", "500")
    first, second = report["results"]
    assert (first["keys_before"], second["keys_before"]) == (0, 500)
    assert second["keys_after"] - first["keys_after"] == 500
    for r in (first, second):
        assert r["bytes_per_job"] > r["by_structure"]["key_table"] > 0


@pytest.mark.timeout(120)
def test_the_enqueue_parts_benchmark_takes_each_part_out(tmp_path: Path) -> None:
    """``bench/enqueue_parts.py`` at its smallest: the script whole, without each part and
    without all of them. Each part that is a Redis command per job leaves one command per
    job out (the SHA-1 is none; the ready push is one RPUSH per batch of 100), which shows
    the edits of enqueue.lua still apply and take effect."""
    results = _bench_json(tmp_path, "enqueue_parts.py", "--jobs", "500", "--rounds", "1")["results"]
    commands = {name: r["commands_per_job"] for name, r in results.items()}
    whole = commands.pop("whole")
    per_job = {k: commands[k] for k in ("seen_check", "derived_id_sha1", "job_hash_write")}
    expected = {"seen_check": whole - 1, "derived_id_sha1": whole, "job_hash_write": whole - 1}
    assert per_job == pytest.approx(expected, abs=0.005)
    # One RPUSH and one wake-up per batch, and the list's first push's ZADD, SADD and ring.
    assert whole - 0.05 < commands["ready_push"] < whole - 0.01
    assert commands["all_parts_out"] == pytest.approx(commands["ready_push"] - 2, abs=0.005)
    for r in results.values():
        assert r["script_us_per_job"] > 0


@pytest.mark.timeout(300)
def test_the_enqueue_parts_benchmark_with_the_coordinators_limits(tmp_path: Path) -> None:
    """``--coordinator-limits``: each job carries the coordinator's default max_pending, as a
    SubmitJobs call's do, and the script reads the tenant's counts for it once per call of
    100 jobs (one command per call more than without limits), not once per job."""
    args = ("enqueue_parts.py", "--jobs", "500", "--rounds", "1")
    plain = _bench_json(tmp_path, *args)
    limited = _bench_json(tmp_path, *args, "--coordinator-limits")  # read before: same file
    assert plain["params"]["limits"]["max_pending"] == 0
    assert limited["params"]["limits"]["max_pending"] == 1_000_000
    more = {
        name: limited["results"][name]["commands_per_job"] - r["commands_per_job"]
        for name, r in plain["results"].items()
    }
    assert more == pytest.approx(dict.fromkeys(more, 0.01), abs=0.005)


@pytest.mark.timeout(300)
def test_the_enqueue_parts_benchmark_with_a_rate_limit(tmp_path: Path) -> None:
    """``--rate-limit``: each job carries a submit rate that never runs out, and the script
    reads and writes the tenant's bucket once per call of 100 jobs (an HMGET, an HSET and a
    PEXPIRE: three commands per call more than without limits), not once per job."""
    args = ("enqueue_parts.py", "--jobs", "500", "--rounds", "1")
    plain = _bench_json(tmp_path, *args)
    limited = _bench_json(tmp_path, *args, "--rate-limit")  # read before: same file
    assert limited["params"]["limits"]["submit_rate_per_s"] == 1e8
    more = {
        name: limited["results"][name]["commands_per_job"] - r["commands_per_job"]
        for name, r in plain["results"].items()
    }
    assert more == pytest.approx(dict.fromkeys(more, 0.03), abs=0.005)


def test_the_enqueue_parts_benchmark_counts_the_servers_instructions(tmp_path: Path) -> None:
    """``--instructions``: the same variants, Redis run under callgrind, counted in
    instructions per job. A count, so two rounds agree closely, and each part taken out
    leaves fewer (the SHA-1 and the HSET are thousands each)."""
    results = _bench_json(
        tmp_path, "enqueue_parts.py", "--instructions", "--jobs", "500", "--rounds", "2"
    )["results"]
    for name, r in results.items():
        first, second = r["rounds"]
        assert first == pytest.approx(second, rel=0.05), name
        assert "script_us_per_job" not in r
    whole = results["whole"]["instructions_per_job"]
    for name in ("seen_check", "derived_id_sha1", "job_hash_write", "ready_push"):
        assert 0 < results[name]["part_instructions_per_job"] < whole, name
    assert results["all_parts_out"]["instructions_per_job"] < whole / 2 + whole / 4


@pytest.mark.timeout(300)
@pytest.mark.parametrize("instructions", [False, True], ids=["timed", "instructions"])
def test_the_enqueue_calls_benchmark_measures_every_shape(
    tmp_path: Path, instructions: bool
) -> None:
    """``bench/enqueue_calls.py`` at its smallest, timed and counted in instructions: each
    shape (one tenant or 100 per batch, ready or delayed) with its commands per job."""
    flag = ["--instructions"] if instructions else []
    results = _bench_json(tmp_path, "enqueue_calls.py", *flag, "--jobs", "300", "--rounds", "1")[
        "results"
    ]
    # A call of one job pays the script's own commands (the shard's state, the tenant's
    # limits and counts, ...) alone: more than a batch's per job, even of 100 tenants.
    single = _bench_json(
        tmp_path, "enqueue_calls.py", "--jobs", "20", "--rounds", "1", "--batch", "1"
    )["results"]
    for shape, r in single.items():
        assert r["commands_per_job"] > 1.5 * results[shape]["commands_per_job"], shape
    assert set(results) == {
        f"{shape}/{state}"
        for shape in ("one_tenant_per_batch", "100_tenants_per_batch")
        for state in ("ready", "delayed")
    }
    unit = "instructions_per_job" if instructions else "script_us_per_job"
    for r in results.values():
        assert r[unit] > 0 and r["commands_per_job"] > 0
    # A batch over 100 tenants costs each tenant its own keys and counts: more per job.
    many, one = results["100_tenants_per_batch/ready"], results["one_tenant_per_batch/ready"]
    assert many["commands_per_job"] > one["commands_per_job"]
    if instructions:
        assert many[unit] > one[unit]


@pytest.mark.timeout(300)
def test_the_script_instructions_benchmark_counts_every_step(tmp_path: Path) -> None:
    """``bench/script_instructions.py`` at its smallest: each step on a job's way counted,
    and a step of a batch's jobs costs thousands of instructions a job, not millions (each
    step is counted apart)."""
    results = _bench_json(tmp_path, "script_instructions.py", "--jobs", "500")["results"]
    assert set(results) == {"enqueue", "claim", "heartbeat", "ack"}
    for name, n in results.items():
        assert 5_000 < n < 1_000_000, name
    # A job at a time, each call's own cost (the command, the script's definitions) is the
    # job's alone: every step costs more per job than in batches.
    single = _bench_json(tmp_path, "script_instructions.py", "--single", "--jobs", "30")
    assert single["params"]["submit_batch"] == 1
    for name, n in single["results"].items():
        assert results[name] < n < 1_000_000, name


@pytest.mark.timeout(120)
def test_the_redis_calls_benchmark_measures_both_connections(tmp_path: Path) -> None:
    """``bench/redis_calls.py`` at its smallest: the caller's CPU and wall time per command,
    each shape with shardq's connection and with redis-py's own checks."""
    results = _bench_json(tmp_path, "redis_calls.py", "--calls", "100", "--rounds", "1")["results"]
    assert set(results) == {"ping", "enqueue_one_job"}
    for by_name in results.values():
        assert set(by_name) == {"shardq", "redis_py_checks"}
        for r in by_name.values():
            assert r["caller_cpu_us_per_call"] > 0 and r["wall_us_per_call"] > 0


def test_the_headline_of_a_run_without_the_first_figures_scenario_shows_its_figures() -> None:
    # A run of drain and delayed alone (no submit, the headline's first scenario), as kept:
    # each of its figures is shown for both tunings, with its ratio to the best peer.
    out = _bench("run.py", "--render", str(BENCH / "reference/2026-12-07-s29-drain-delayed.json"))
    drain = next(line for line in out.splitlines() if line.lstrip().startswith("drain 20k"))
    assert "shardq-tuned 18,400" in drain and "ratio 2.548" in drain, drain
    assert "shardq-defaults 10,097" in drain, drain


@pytest.mark.timeout(120)
def test_the_gc_pauses_benchmark_logs_every_python_process_the_command_starts(
    tmp_path: Path,
) -> None:
    """``bench/gc_pauses.py`` over a Python process that starts another: both log their
    collections (``--min-ms 0``: every one), the parent's full ones before and after its
    ``gc.freeze()`` told apart, and the command's exit status is the tool's."""
    child = "import gc; gc.collect()"
    parent = (
        "import gc, subprocess, sys; gc.collect(); gc.collect(); gc.freeze(); gc.collect(); "
        f"subprocess.run([sys.executable, '-c', {child!r}], check=True); sys.exit(3)"
    )
    out = tmp_path / "gc.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "gc_pauses.py"), "--min-ms", "0", "--out", str(out),
         "--", sys.executable, "-c", parent],
        capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    report = json.loads(out.read_text())
    assert report["exit_status"] == 3 and report["min_ms"] == 0
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for pause in report["pauses"]:
        by_pid.setdefault(pause["pid"], []).append(pause)
    assert len(by_pid) == 2, by_pid.keys()  # the parent and its child, each logged
    (kind,) = report["by_process"]
    assert kind == "-c" and report["by_process"][kind]["processes"] == 2
    full = {pid: [p["after_freeze"] for p in ps if p["generation"] == 2]
            for pid, ps in by_pid.items()}  # fmt: skip
    parent, child = sorted(by_pid, key=lambda pid: any(full[pid]), reverse=True)
    # The parent's two full collections before its freeze, then its one after it and the one
    # the interpreter makes at exit; the child (never frozen) has its own and its exit's.
    assert full[parent] == [False, False, True, True], full
    assert full[child] == [False, False], full
    assert report["by_process"][kind]["after_freeze"]["full_collections"] == 2


@pytest.mark.timeout(180)
def test_the_startup_benchmark_times_the_programs_beside_other_scripts(tmp_path: Path) -> None:
    """``bench/startup.py`` with one run: a figure for every command, the servers' too with
    ``--programs``, and each again for the scripts ``--vs-bin`` names (here the same)."""
    bin_dir = str(Path(sys.executable).parent)
    report = _bench_json(
        tmp_path, "startup.py", "--runs", "1", "--top", "1", "--programs", "--vs-bin", bin_dir,
        timeout=150,
    )  # fmt: skip
    programs = ["shardq --help", "shardq get --help", "shardq tokens --help",
                "shardq migrate --help", "shardq-worker --help", "shardq-coordinator --help",
                "shardq-shard --help"]  # fmt: skip
    assert set(report["results"]) == {
        "python -c pass",
        *programs,
        *(f"vs: {name}" for name in programs),
        "python -m shardq._programs shardq.worker --help",
        "python -m shardq.worker --help",
    }
    assert report["vs_bin"] == bin_dir and len(report["commit"]) == 40
    for figures in report["results"].values():
        assert 0 < figures["wall_s_min"] <= figures["wall_s_median"] <= figures["wall_s_max"]
