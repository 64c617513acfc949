"""A smoke run of the benchmark, for the test suite: seconds, not a measurement.

    python bench/smoke.py            # exits 0 when the run and the JSON look right

or from a test::

    from bench.smoke import smoke    # (or load it by path: bench/ is not a package)
    smoke(tmp_path)                  # raises AssertionError on a wrong shape

It runs ``bench/run.py --quick --peers rq`` (rq's venv is made under bench/.venvs/ on first
use, from PyPI) and shardq in both tunings, ``shardq-tuned`` and ``shardq-defaults`` (the
project's .venv, a real cluster per run), then checks the JSON: the commit measured and the
machine (with rq's single-submit rate as its yardstick), every scenario measured for both
shardq systems and every shared one for rq, with its figures (numbers), stated concurrency,
tuning and every process the run had, the scenarios shardq alone has marked unsupported for
rq, a headline ratio of each shardq system for every headline figure, and that the rendered
table states the commit, the cores and the yardstick.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEER_SCENARIOS = {
    "submit": {"single_jobs_per_s", "batch_jobs_per_s"},
    "drain": {
        "jobs_per_s",
        "drain_s",
        "launch_to_first_start_s",
        "cpu_us_per_job",
        "cpu_us_per_job_workers",
        "cpu_us_per_job_redis",
    },
    "latency": {"p50_ms", "p99_ms", "max_ms"},
    "delayed": {"p50_ms", "p99_ms", "max_ms", "min_ms", "early_jobs"},
    "fairness": {"b_wait_p99_ms", "a_wait_p99_ms", "b_p99_over_a_p99"},
}
SHARDQ_ONLY = {"scale", "multishard", "fairness_priority"}
SHARDQ_SCENARIOS = {
    **PEER_SCENARIOS,
    "submit": {"single_jobs_per_s", "unary_64_in_flight_jobs_per_s", "batch_jobs_per_s",
               "batch_4_in_flight_jobs_per_s"},
    "drain": {*PEER_SCENARIOS["drain"], "start_jobs_per_s", "cpu_us_per_job_coordinator",
              "cpu_us_per_job_shard_loops", "cpu_us_per_job_postgres"},
    "scale": {"redis_bytes_per_scheduled_job", "claim_us_per_job_empty", "claim_us_per_job_loaded",
              "promote_us_per_job_empty", "promote_us_per_job_loaded"},
    "multishard": {"jobs_per_s_1_shards", "jobs_per_s_2_shards"},
    "fairness_priority": PEER_SCENARIOS["fairness"],
}  # fmt: skip
TOP_KEYS = {"schema", "command", "machine", "services", "systems", "params", "runs", "summary",
            "headline", "repeat", "quick", "scenarios", "commit"}  # fmt: skip
#: shardq's two systems and the --concurrency each runs its workers with.
SHARDQ_SYSTEMS = {"shardq-tuned": 200, "shardq-defaults": 16}
#: Processes every shardq run that starts a cluster states (config.processes_all).
SHARDQ_PROCESSES = {"shardq-worker", "shardq-coordinator", "shardq-shard", "redis-server",
                    "postgres", "bench driver"}  # fmt: skip


def check_commit_and_machine(result: dict[str, Any]) -> None:
    commit = result["commit"]
    assert len(commit["sha"]) == 40 and int(commit["sha"], 16) >= 0, commit
    assert isinstance(commit["dirty"], bool), commit
    assert commit["dirty"] == bool(commit["dirty_paths"]), commit
    machine = result["machine"]
    assert machine["cpu_count"] and machine["python"] and machine["redis_version"]
    assert isinstance(machine["cpu_model"], str), machine
    assert isinstance(machine["cores"], int) and machine["cores"] >= 1, machine
    # rq's submit ran, so the yardstick is its single-submit median.
    yardstick = machine["yardstick_rq_single_submit_per_s"]
    assert yardstick == result["summary"]["submit"]["single_jobs_per_s"]["rq"]["median"]
    assert machine["yardstick_note"], machine


def check_tuning(run: dict[str, Any], system: str) -> None:
    """The run states its tuning next to the library's defaults, and every process."""
    tuning = run["config"]["tuning"]
    assert tuning["knobs"] and tuning["library_defaults"] and tuning["note"], tuning
    names = {p["process"] for p in run["config"]["processes_all"]}
    assert all(p["count"] and p["role"] for p in run["config"]["processes_all"]), run["config"]
    if system == "rq":
        assert tuning["variant"] is None and tuning["knobs"]["jobs_in_flight_per_process"] == 1
        assert {"rq worker", "redis-server", "bench driver"} <= names, names
        return
    assert tuning["variant"] == system.removeprefix("shardq-"), (system, tuning)
    concurrency = SHARDQ_SYSTEMS[system]
    assert tuning["knobs"]["concurrency"] == concurrency, tuning
    assert tuning["library_defaults"]["concurrency"] == 16, tuning
    if run["scenario"] != "scale":  # scale runs in the bench process alone: no workers
        assert f"--concurrency {concurrency}`" in run["config"]["concurrency"]["how"], run
        assert names == SHARDQ_PROCESSES, names


def check_headline(result: dict[str, Any]) -> None:
    rows = result["headline"]
    assert all(h["shardq_system"] == "shardq-tuned" for h in rows), rows
    assert all(h["shardq"] is not None for h in rows), rows
    for h in rows:
        assert set(h["shardq_variants"]) == set(SHARDQ_SYSTEMS), h
        assert h["shardq"] == h["shardq_variants"]["shardq-tuned"]["median"], h
    # A ratio of each shardq wherever a peer ran the scenario; shardq-only figures stand alone.
    shared = [h for h in rows if h["scenario"] not in SHARDQ_ONLY]
    assert all(h["ratio_shardq_over_best_peer"] for h in shared), rows
    assert all(v["ratio_over_best_peer"] for h in shared for v in h["shardq_variants"].values())
    assert [h for h in rows if h["best_peer"] == "rq"], rows


def check(result: dict[str, Any]) -> None:
    """Assert that a --quick run over rq and shardq produced the expected shape."""
    assert result.keys() >= TOP_KEYS, TOP_KEYS - result.keys()
    assert result["schema"] == "shardq-bench/1"
    check_commit_and_machine(result)
    assert result["services"]["redis"]["version"]
    assert set(result["systems"]) == {*SHARDQ_SYSTEMS, "rq"}
    assert result["systems"]["rq"]["versions"]["rq"]

    runs = result["runs"]
    errors = [r for r in runs if r["status"] == "error"]
    assert not errors, errors
    for scenario, figures in PEER_SCENARIOS.items():
        ok = [r for r in runs if r["system"] == "rq" and r["scenario"] == scenario]
        assert [r["status"] for r in ok] == ["ok"], (scenario, ok)
        run = ok[0]
        assert figures <= run["metrics"].keys(), (scenario, run["metrics"])
        assert all(isinstance(v, int | float) for v in run["metrics"].values())
        assert run["config"]["concurrency"]["processes"] == 2
        assert run["config"]["params"] == result["params"][scenario]
        check_tuning(run, "rq")
        stats = result["summary"][scenario][next(iter(figures))]["rq"]
        assert stats["n"] == 1 and stats["min"] <= stats["median"] <= stats["max"]
    for scenario in SHARDQ_ONLY:
        rq = [r for r in runs if r["system"] == "rq" and r["scenario"] == scenario]
        assert [r["status"] for r in rq] == ["unsupported"], rq
    for system in SHARDQ_SYSTEMS:
        described = result["systems"][system]
        assert not described.get("skipped"), described
        assert described["tuning"] == system.removeprefix("shardq-"), described
        for scenario, figures in SHARDQ_SCENARIOS.items():
            ok = [r for r in runs if r["system"] == system and r["scenario"] == scenario]
            assert [r["status"] for r in ok] == ["ok"], (system, scenario, ok)
            run = ok[0]
            assert figures <= run["metrics"].keys(), (scenario, run["metrics"])
            assert all(isinstance(v, int | float) for v in run["metrics"].values()), run
            assert run["config"]["params"] == result["params"][scenario]
            assert run["config"]["concurrency"]["how"], run["config"]
            if scenario != "scale":  # scale runs in the bench process alone
                assert run["config"]["concurrency"]["processes"] == 2, run["config"]
            assert run["config"].get("duplicates", 0) == 0, run["config"]
            check_tuning(run, system)
        drain = next(r for r in runs if r["system"] == system and r["scenario"] == "drain")
        assert drain["config"]["result_rows"] == drain["params"]["n"], drain["config"]
    check_headline(result)


def check_rendered(result: dict[str, Any], text: str) -> None:
    """The table (--render, --markdown) states the commit, the machine and the yardstick."""
    assert f"commit: {result['commit']['sha'][:12]}" in text, text[:500]
    assert f"{result['machine']['cores']} cores" in text, text[:500]
    assert "yardstick (rq single submits): " in text, text[:500]
    assert "yardstick (rq single submits): none" not in text, text[:500]
    assert "| shardq-tuned | shardq-tuned / best peer | shardq-defaults |" in text, text


def smoke(workdir: str | Path | None = None, timeout: float = 480) -> dict[str, Any]:
    """Run the quick benchmark for rq and shardq; check and return the JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(workdir or tmp) / "smoke.json"
        cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--peers", "rq", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, f"run.py failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        result: dict[str, Any] = json.loads(out.read_text())
        check(result)
        cmd = [sys.executable, str(HERE / "run.py"), "--render", str(out), "--markdown"]
        shown = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        assert shown.returncode == 0, shown.stderr[-4000:]
        check_rendered(result, shown.stdout)
    return result


if __name__ == "__main__":
    smoke()
    print("bench smoke: ok")
