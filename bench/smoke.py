"""A smoke run of the benchmark, for the test suite: seconds, not a measurement.

    python bench/smoke.py            # exits 0 when the run and the JSON look right

or from a test::

    from bench.smoke import smoke    # (or load it by path: bench/ is not a package)
    smoke(tmp_path)                  # raises AssertionError on a wrong shape

It runs ``bench/run.py --quick --peers rq`` (rq's venv is made under bench/.venvs/ on first
use, from PyPI) and shardq (the project's .venv, a real cluster per run), then checks the JSON:
every scenario measured for shardq and every shared one for rq, with its figures (numbers) and
stated concurrency, the scenarios shardq alone has marked unsupported for rq, and a headline
ratio for every headline figure.
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
    "drain": {"jobs_per_s", "drain_s", "launch_to_first_start_s"},
    "latency": {"p50_ms", "p99_ms", "max_ms"},
    "delayed": {"p50_ms", "p99_ms", "max_ms", "min_ms", "early_jobs"},
    "fairness": {"b_wait_p99_ms", "a_wait_p99_ms", "b_p99_over_a_p99"},
}
SHARDQ_ONLY = {"scale", "multishard", "fairness_priority"}
SHARDQ_SCENARIOS = {
    **PEER_SCENARIOS,
    "submit": {"single_jobs_per_s", "unary_64_in_flight_jobs_per_s", "batch_jobs_per_s",
               "batch_4_in_flight_jobs_per_s"},
    "drain": {"jobs_per_s", "drain_s", "start_jobs_per_s", "launch_to_first_start_s"},
    "scale": {"redis_bytes_per_scheduled_job", "claim_us_per_job_empty", "claim_us_per_job_loaded",
              "promote_us_per_job_empty", "promote_us_per_job_loaded"},
    "multishard": {"jobs_per_s_1_shards", "jobs_per_s_2_shards"},
    "fairness_priority": PEER_SCENARIOS["fairness"],
}  # fmt: skip
TOP_KEYS = {"schema", "command", "machine", "services", "systems", "params", "runs", "summary",
            "headline", "repeat", "quick", "scenarios"}  # fmt: skip


def check(result: dict[str, Any]) -> None:
    """Assert that a --quick run over rq and shardq produced the expected shape."""
    assert result.keys() >= TOP_KEYS, TOP_KEYS - result.keys()
    assert result["schema"] == "shardq-bench/1"
    machine = result["machine"]
    assert machine["cpu_count"] and machine["python"] and machine["redis_version"]
    assert result["services"]["redis"]["version"]
    assert set(result["systems"]) == {"shardq", "rq"}
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
        stats = result["summary"][scenario][next(iter(figures))]["rq"]
        assert stats["n"] == 1 and stats["min"] <= stats["median"] <= stats["max"]
    for scenario in SHARDQ_ONLY:
        rq = [r for r in runs if r["system"] == "rq" and r["scenario"] == scenario]
        assert [r["status"] for r in rq] == ["unsupported"], rq
    assert not result["systems"]["shardq"].get("skipped"), result["systems"]["shardq"]
    for scenario, figures in SHARDQ_SCENARIOS.items():
        ok = [r for r in runs if r["system"] == "shardq" and r["scenario"] == scenario]
        assert [r["status"] for r in ok] == ["ok"], (scenario, ok)
        run = ok[0]
        assert figures <= run["metrics"].keys(), (scenario, run["metrics"])
        assert all(isinstance(v, int | float) for v in run["metrics"].values()), run["metrics"]
        assert run["config"]["params"] == result["params"][scenario]
        assert run["config"]["concurrency"]["how"], run["config"]
        if scenario != "scale":  # scale runs in the bench process alone
            assert run["config"]["concurrency"]["processes"] == 2, run["config"]
        assert run["config"].get("duplicates", 0) == 0, run["config"]
    drain = next(r for r in runs if r["system"] == "shardq" and r["scenario"] == "drain")
    assert drain["config"]["result_rows"] == drain["params"]["n"], drain["config"]
    assert all(h["shardq"] is not None for h in result["headline"]), result["headline"]
    # A ratio wherever a peer ran the scenario; shardq-only figures stand alone.
    shared = [h for h in result["headline"] if h["scenario"] not in SHARDQ_ONLY]
    assert all(h["ratio_shardq_over_best_peer"] for h in shared), result["headline"]
    rq_best = [h for h in result["headline"] if h["best_peer"] == "rq"]
    assert rq_best, result["headline"]


def smoke(workdir: str | Path | None = None, timeout: float = 240) -> dict[str, Any]:
    """Run the quick benchmark for rq and shardq; check and return the JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(workdir or tmp) / "smoke.json"
        cmd = [sys.executable, str(HERE / "run.py"), "--quick", "--peers", "rq", "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, f"run.py failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
        result: dict[str, Any] = json.loads(out.read_text())
    check(result)
    return result


if __name__ == "__main__":
    smoke()
    print("bench smoke: ok")
