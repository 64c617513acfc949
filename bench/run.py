"""shardq vs Celery, RQ, arq and Dramatiq, side by side in one run.

    python bench/run.py [--scenarios drain latency ...] [--peers rq celery ...] [--repeat 3]
                        [--quick] [--no-shardq] [--out bench/results/<timestamp>.json]

Creates one venv per peer under bench/.venvs/ (pinned by bench/peers/requirements/), starts
its own redis-server (and PostgreSQL when shardq needs it) on free ports, runs every scenario
for every system that supports it — each run a fresh subprocess in that system's venv, Redis
flushed before it — repeats each ``--repeat`` times (interleaving the systems), prints one
table and writes every run with its configuration to a JSON file. See docs/benchmarks.md.

Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from services import PostgresServer, RedisServer  # noqa: E402

ROOT = HERE.parent
VENVS = HERE / ".venvs"
PEERS = ["celery", "rq", "arq", "dramatiq"]
SCENARIOS = [
    "submit", "drain", "latency", "delayed", "scale", "fairness", "fairness_priority", "multishard",
]  # fmt: skip

FULL: dict[str, dict[str, Any]] = {
    "submit": {"n_single": 10_000, "n_batch": 50_000, "batch_size": 100},
    "drain": {"n": 20_000, "batch_size": 1000, "timeout_s": 900},
    "latency": {"n": 200, "gap_min_s": 0.01, "gap_max_s": 0.03},
    "delayed": {"n": 5000, "due_per_s": 1000, "lead_s": 8.0, "timeout_s": 120},
    "scale": {"scheduled": 1_000_000},
    "fairness": {"n_a": 50_000, "n_b": 100, "batch_size": 1000, "b_gap_s": 0.01, "timeout_s": 900},
    "fairness_priority": {
        "n_a": 50_000,
        "n_b": 100,
        "batch_size": 1000,
        "b_gap_s": 0.01,
        "timeout_s": 900,
        "a_priority": 9,
        "b_priority": 0,
    },
    "multishard": {"shards": [1, 2, 4], "n": 20_000},
}
QUICK: dict[str, dict[str, Any]] = {
    "submit": {"n_single": 200, "n_batch": 200, "batch_size": 100},
    "drain": {"n": 200, "batch_size": 100, "timeout_s": 60},
    "latency": {"n": 20, "gap_min_s": 0.005, "gap_max_s": 0.015},
    "delayed": {"n": 200, "due_per_s": 1000, "lead_s": 1.5, "timeout_s": 30},
    "scale": {"scheduled": 1000},
    "fairness": {"n_a": 500, "n_b": 10, "batch_size": 100, "b_gap_s": 0.005, "timeout_s": 60},
    "fairness_priority": {
        "n_a": 500,
        "n_b": 10,
        "batch_size": 100,
        "b_gap_s": 0.005,
        "timeout_s": 60,
        "a_priority": 9,
        "b_priority": 0,
    },
    "multishard": {"shards": [1, 2], "n": 200},
}

# The headline figures: (scenario, metric, which way is better, label).
HEADLINE = [
    ("submit", "single_jobs_per_s", "higher", "submit, single calls (jobs/s)"),
    ("submit", "batch_jobs_per_s", "higher", "submit, bulk API batches (jobs/s)"),
    ("drain", "jobs_per_s", "higher", "drain 20k no-ops, 2 procs (jobs/s)"),
    ("latency", "p50_ms", "lower", "idle-to-start p50 (ms)"),
    ("latency", "p99_ms", "lower", "idle-to-start p99 (ms)"),
    ("delayed", "p99_ms", "lower", "delayed lateness p99 (ms)"),
    ("delayed", "max_ms", "lower", "delayed lateness max (ms)"),
    ("fairness", "b_wait_p99_ms", "lower", "flood: tenant B wait p99 (ms)"),
    ("fairness_priority", "b_wait_p99_ms", "lower", "flood at priority 9: B wait p99 (ms)"),
]


# --- systems and their venvs --------------------------------------------------------------


def ensure_venv(peer: str, python: str) -> str:
    """bench/.venvs/<peer> with the pinned requirements; reinstalled when they change."""
    reqs = HERE / "peers" / "requirements" / f"{peer}.txt"
    digest = hashlib.sha256(reqs.read_bytes()).hexdigest()
    venv = VENVS / peer
    stamp = venv / ".bench-requirements"
    py = venv / "bin" / "python"
    if py.exists() and stamp.exists() and stamp.read_text() == digest:
        return str(py)
    print(f"[bench] installing {peer} into {venv} ...", file=sys.stderr, flush=True)
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(reqs)], check=True)
    stamp.write_text(digest)
    return str(py)


def system_commands(args: argparse.Namespace) -> dict[str, list[str]]:
    systems: dict[str, list[str]] = {}
    if not args.no_shardq:
        systems["shardq"] = [args.shardq_python, str(HERE / "shardq_bench.py")]
    for peer in args.peers:
        python = ensure_venv(peer, args.venv_python)
        systems[peer] = [python, str(HERE / "peers" / f"{peer}_bench.py")]
    return systems


def call(command: list[str], request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request to a system's script; its last stdout line is the answer."""
    try:
        proc = subprocess.run(
            command,
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=str(HERE),
        )
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {timeout}s", "stderr_tail": str(exc.stderr)[-2000:]}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit status {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {"error": "last stdout line is not JSON", "stderr_tail": proc.stderr[-2000:]}
    return answer


# --- running ------------------------------------------------------------------------------


def machine_info(redis: RedisServer) -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = redis.info("server")
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_version": info.get("redis_version"),
        "loadavg_at_start": list(os.getloadavg()),
        "note": "shared machine: loadavg_before of each run shows what else was running",
    }


def shard_servers(ctx: dict[str, Any], params: dict[str, Any]) -> list[RedisServer]:
    """Redis servers beyond the first for a scenario with several shards (``params.shards``):
    one server per shard, since a shard is a Redis server, started once and kept for the run."""
    wanted = max(params.get("shards", [1])) - 1
    extra: list[RedisServer] = ctx["extra_redis"]
    while len(extra) < wanted:
        extra.append(ctx["stack"].enter_context(RedisServer(ctx["redis_binary"])))
    return extra[:wanted]


def one_run(
    ctx: dict[str, Any], system: str, scenario: str, repeat: int, params: dict[str, Any]
) -> dict[str, Any]:
    redis: RedisServer = ctx["redis"]
    redis.flush()
    servers = [redis, *shard_servers(ctx, params)]
    for extra in servers[1:]:
        extra.flush()
    workdir = tempfile.mkdtemp(prefix=f"{scenario}-{system}-{repeat}-", dir=ctx["tmp"])
    request = {
        "op": "run",
        "scenario": scenario,
        "params": params,
        "redis_url": redis.url,
        "redis_urls": [r.url for r in servers],
        "postgres_url": ctx["postgres_url"],
        "workdir": workdir,
        "repeat": repeat,
        "quick": ctx["quick"],
    }
    load = list(os.getloadavg())
    t0 = time.monotonic()
    answer = call(ctx["systems"][system], request, timeout=ctx["run_timeout"])
    record = {
        "system": system,
        "scenario": scenario,
        "repeat": repeat,
        "params": params,
        "loadavg_before": load,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    for key in ("skipped", "unsupported", "error"):
        if key in answer:
            record["status"] = key
            record["reason"] = answer[key]
            if "stderr_tail" in answer:
                record["stderr_tail"] = answer["stderr_tail"]
            return record
    record.update(
        status="ok",
        metrics=answer.get("metrics", {}),
        config=answer.get("config", {}),
        versions=answer.get("versions", {}),
    )
    return record


def status_of(described: dict[str, Any], scenario: str) -> tuple[str, str] | None:
    """(status, reason) when a system will not run this scenario, else None."""
    if "error" in described:
        return "error", described["error"]
    if described.get("skipped"):
        return "skipped", described["skipped"]
    support = described.get("scenarios", {}).get(scenario, "unsupported: not listed")
    if support != "supported":
        return "unsupported", support.removeprefix("unsupported: ")
    return None


def run_all(ctx: dict[str, Any], args: argparse.Namespace) -> None:
    runs: list[dict[str, Any]] = ctx["runs"]
    table = QUICK if args.quick else FULL
    for scenario in args.scenarios:
        params = table[scenario]
        for system, described in ctx["described"].items():
            off = status_of(described, scenario)
            if off:
                runs.append({"system": system, "scenario": scenario, "status": off[0],
                             "reason": off[1], "params": params})  # fmt: skip
        active = [s for s, d in ctx["described"].items() if status_of(d, scenario) is None]
        for repeat in range(args.repeat):
            for system in active:  # interleaved, so slow drift of the machine hits all alike
                print(f"[bench] {scenario} / {system} / run {repeat + 1}", file=sys.stderr)
                record = one_run(ctx, system, scenario, repeat, params)
                runs.append(record)
                brief = record.get("metrics") or record.get("reason")
                print(f"[bench]   -> {record['status']}: {brief}", file=sys.stderr, flush=True)
                ctx["save"]()  # a partial file ("complete": false) survives an interrupted run


# --- reporting ----------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """scenario -> metric -> system -> {median, min, max, n, values}."""
    values: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in runs:
        if run["status"] != "ok":
            continue
        for metric, value in run["metrics"].items():
            if isinstance(value, int | float):
                per = values.setdefault(run["scenario"], {}).setdefault(metric, {})
                per.setdefault(run["system"], []).append(value)
    return {
        scenario: {
            metric: {
                system: {
                    "median": statistics.median(vals),
                    "min": min(vals),
                    "max": max(vals),
                    "n": len(vals),
                    "values": vals,
                }
                for system, vals in per.items()
            }
            for metric, per in metrics.items()
        }
        for scenario, metrics in values.items()
    }


def headline(summary: dict[str, Any], peers: list[str]) -> list[dict[str, Any]]:
    rows = []
    for scenario, metric, better, label in HEADLINE:
        per = summary.get(scenario, {}).get(metric, {})
        peer_medians = {p: per[p]["median"] for p in peers if p in per}
        row: dict[str, Any] = {"scenario": scenario, "metric": metric, "label": label,
                               "better": better, "best_peer": None, "best_peer_median": None,
                               "shardq": None, "ratio_shardq_over_best_peer": None}  # fmt: skip
        if peer_medians:
            pick = max if better == "higher" else min
            best = pick(peer_medians, key=lambda p: peer_medians[p])
            row.update(best_peer=best, best_peer_median=peer_medians[best])
        if "shardq" in per:
            row["shardq"] = per["shardq"]["median"]
            if row["best_peer_median"]:
                row["ratio_shardq_over_best_peer"] = round(
                    row["shardq"] / row["best_peer_median"], 3
                )
        rows.append(row)
    return rows


def _fmt(x: float) -> str:
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(stats: dict[str, Any] | None) -> str:
    if not stats:
        return "-"
    return f"{_fmt(stats['median'])} [{_fmt(stats['min'])}–{_fmt(stats['max'])}] n={stats['n']}"


def render(result: dict[str, Any], markdown: bool = False) -> str:
    """The table: one row per figure, one column per system; then the headline."""
    rows = table_rows(result)
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(1, "|" + "---|" * len(rows[0]))
        lines += ["", "Cells: median [min–max] n=repeats."]
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines += ["", "cells: median [min–max] n=repeats"]
    for name, described in result["systems"].items():
        if described.get("skipped") or described.get("error"):
            why = described.get("skipped") or described.get("error")
            lines.append(f"{name}: not measured ({why}) — no numbers reported")
    lines += ["", "headline (shardq / best peer):"]
    if markdown:
        lines += ["", "| figure | shardq | best peer | shardq / best peer |", "|---|---|---|---|"]
    for h in result["headline"]:
        shardq = "pending" if h["shardq"] is None else _fmt(h["shardq"])
        best = "-" if h["best_peer"] is None else f"{h['best_peer']} {_fmt(h['best_peer_median'])}"
        ratio = h["ratio_shardq_over_best_peer"]
        ratio_text = "pending" if ratio is None else str(ratio)
        if markdown:
            lines.append(f"| {h['label']} | {shardq} | {best} | {ratio_text} |")
        else:
            lines.append(f"  {h['label']:<40} shardq {shardq:<10} best peer {best:<22} "
                         f"ratio {ratio_text}")  # fmt: skip
    return "\n".join(lines)


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    systems = list(result["systems"])
    summary = result["summary"]
    not_run = {
        (r["system"], r["scenario"]): r["status"] for r in result["runs"] if r["status"] != "ok"
    }
    header = ["scenario / figure", *systems]
    rows = [header]
    for scenario in result["scenarios"]:
        for metric, per in summary.get(scenario, {}).items():
            row = [f"{scenario} / {metric}"]
            for system in systems:
                row.append(cell(per.get(system)) if system in per else
                           not_run.get((system, scenario), "-"))  # fmt: skip
            rows.append(row)
        if scenario not in summary:
            rows.append([f"{scenario}", *(not_run.get((s, scenario), "-") for s in systems)])
    return rows


# --- main ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    default_py = ROOT / ".venv" / "bin" / "python"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=SCENARIOS)
    ap.add_argument("--peers", nargs="*", choices=PEERS, default=PEERS)
    ap.add_argument("--repeat", type=int, default=None, help="runs per figure (3; --quick: 1)")
    ap.add_argument("--quick", action="store_true", help="tiny counts: a smoke run in seconds")
    ap.add_argument("--no-shardq", action="store_true", help="peers only")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (bench/results/<ts>.json)")
    ap.add_argument(
        "--shardq-python",
        default=str(default_py) if default_py.exists() else sys.executable,
        help="interpreter for bench/shardq_bench.py (default: the project's .venv)",
    )
    ap.add_argument(
        "--venv-python", default=sys.executable, help="interpreter the peer venvs are made from"
    )
    ap.add_argument("--redis-server", default="redis-server")
    ap.add_argument("--render", type=Path, help="print the table of an existing results file")
    ap.add_argument("--markdown", action="store_true", help="with --render: a Markdown table")
    args = ap.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if args.out is None:
        args.out = HERE / "results" / f"{stamp}{'-quick' if args.quick else ''}.json"
    args.run_timeout = 300 if args.quick else 1800
    return args


def build_result(ctx: dict[str, Any], args: argparse.Namespace, complete: bool) -> dict[str, Any]:
    runs = ctx["runs"]
    summary = summarize(runs)
    return {
        "schema": "shardq-bench/1",
        "complete": complete,  # false in the file written after each run while it goes on
        "command": ctx["command"],
        "started_at": ctx["started"],
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "quick": args.quick,
        "repeat": args.repeat,
        "scenarios": args.scenarios,
        "machine": ctx["machine"],
        "services": ctx["services"],
        "systems": ctx["described"],
        "params": {s: (QUICK if args.quick else FULL)[s] for s in args.scenarios},
        "runs": runs,
        "summary": summary,
        "headline": headline(summary, [p for p in args.peers if p in ctx["described"]]),
    }


def save(ctx: dict[str, Any], args: argparse.Namespace, complete: bool) -> dict[str, Any]:
    result = build_result(ctx, args, complete)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(args.out)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.render:
        rendered: dict[str, Any] = json.loads(args.render.read_text())
        print(render(rendered, markdown=args.markdown))
        return rendered
    started = dt.datetime.now(dt.UTC).isoformat()
    systems = system_commands(args)
    described = {name: call(cmd, {"op": "describe"}, timeout=120) for name, cmd in systems.items()}
    needs_pg = any(
        "postgres" in d.get("needs", []) and not d.get("skipped") for d in described.values()
    )
    with (
        tempfile.TemporaryDirectory(prefix="shardq-bench-") as tmp,
        RedisServer(args.redis_server) as redis,
        contextlib.ExitStack() as stack,
    ):
        postgres = PostgresServer() if needs_pg else None
        if postgres:
            postgres.__enter__()
        try:
            machine = machine_info(redis)
            ctx = {"redis": redis, "tmp": tmp, "systems": systems, "described": described,
                   "quick": args.quick, "run_timeout": args.run_timeout,
                   "postgres_url": postgres.url if postgres else None,
                   "command": [Path(sys.executable).name, *sys.argv] if argv is None else argv,
                   "started": started, "machine": machine, "runs": [],
                   "stack": stack, "extra_redis": [], "redis_binary": args.redis_server,
                   "services": {"redis": {"version": machine["redis_version"],
                                          "args": redis.args[1:]},
                                "postgres": {"version": postgres.version()} if postgres else None},
                   "save": lambda: save(ctx, args, complete=False)}  # fmt: skip
            run_all(ctx, args)
        finally:
            if postgres:
                postgres.__exit__(None, None, None)
    result = save(ctx, args, complete=True)
    print(render(result))
    print(f"\nresults: {args.out}")
    return result


if __name__ == "__main__":
    main()
