"""shardq vs Celery, RQ, arq and Dramatiq, side by side in one run.

    python bench/run.py [--scenarios drain latency ...] [--peers rq celery ...] [--repeat 3]
                        [--shardq-tuning defaults|tuned|both] [--peer-tuning defaults|tuned|both]
                        [--quick] [--no-shardq] [--out bench/results/<timestamp>.json]

Creates one venv per peer under bench/.venvs/ (pinned by bench/peers/requirements/), starts
its own redis-server (and PostgreSQL when shardq needs it) on free ports, runs every scenario
for every system that supports it — each run a fresh subprocess in that system's venv, Redis
flushed before it — repeats each ``--repeat`` times (interleaving the systems), prints one
table and writes every run with its configuration to a JSON file. See docs/benchmarks.md.

A system with knobs runs as one system per tuning asked for: ``shardq-tuned`` and
``shardq-defaults`` (``--shardq-tuning``), ``celery-tuned``, ``dramatiq-defaults``, ...
(``--peer-tuning``); rq has no knob and runs once, as ``rq``.

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
TUNING_CHOICES = {"defaults": ["defaults"], "tuned": ["tuned"], "both": ["tuned", "defaults"]}
#: The shardq system the headline ratio uses, the first of these that ran ("shardq": a results
#: file from before the variants, whose shardq was the tuned one).
HEADLINE_SHARDQ = ["shardq-tuned", "shardq-defaults", "shardq"]
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
    ("drain", "jobs_per_s", "higher", "drain 20k no-ops, 2 worker procs (jobs/s)"),
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


def is_shardq(system: str) -> bool:
    return system == "shardq" or system.startswith("shardq-")


def expand_tunings(
    args: argparse.Namespace, commands: dict[str, list[str]], described: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """One system per (library, tuning asked for): ({name: {command, tuning}}, {name: its
    describe answer with ``tuning`` and ``knobs``}). A library without knobs (rq) or one that
    could not describe itself stays one system under its own name."""
    systems: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {}
    for base, command in commands.items():
        answer = described[base]
        tunings: dict[str, Any] = answer.get("tunings") or {}
        wanted = TUNING_CHOICES[args.shardq_tuning if base == "shardq" else args.peer_tuning]
        variants = [t for t in wanted if t in tunings]
        if not variants:
            systems[base] = {"command": command, "tuning": None}
            out[base] = answer
            continue
        for tuning in variants:
            name = f"{base}-{tuning}"
            systems[name] = {"command": command, "tuning": tuning}
            out[name] = {**answer, "tuning": tuning, "knobs": tunings[tuning]}
    return systems, out


def git_state(path: Path) -> dict[str, Any]:
    """The checkout at ``path``: HEAD, and whether (and where) its tree differs from HEAD,
    untracked files included (they may be imported), at the start of the run."""

    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(path), *argv], capture_output=True,
                                  text=True, timeout=60, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if sha is None:
        return {"sha": None, "dirty": None, "checkout": str(path),
                "note": "not a git checkout, or no git: the commit is unknown"}  # fmt: skip
    top = (git("rev-parse", "--show-toplevel") or str(path)).strip()
    changed = [line[3:] for line in (git("status", "--porcelain") or "").splitlines()]
    return {
        "sha": sha.strip(),
        "dirty": bool(changed),
        "dirty_paths": changed[:200],
        "checkout": top,
        "when": "at the start of the run",
    }


def commit_info(described: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the commit measured: the checkout shardq is imported from, or the harness's when no
    shardq ran; the harness's own when that is another checkout, else None)."""
    harness = git_state(ROOT)
    source = next(
        (d["source"] for n, d in described.items() if is_shardq(n) and d.get("source")), None
    )
    if source is None:
        return harness, None
    measured = git_state(Path(source))
    if measured.get("checkout") == harness.get("checkout"):
        return measured, None
    return measured, harness


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
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this run may use
    except (AttributeError, OSError):
        cores = os.cpu_count() or 0
    return {
        "cpu_count": os.cpu_count(),
        "cores": cores,
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
    spec = ctx["systems"][system]
    if spec["tuning"]:
        request["tuning"] = spec["tuning"]
    answer = call(spec["command"], request, timeout=ctx["run_timeout"])
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


def headline(summary: dict[str, Any], systems: list[str]) -> list[dict[str, Any]]:
    """Per headline figure: the best peer (over every peer system, whatever its tuning) and
    each shardq system's median and ratio to it; ``shardq``/``ratio_shardq_over_best_peer``
    are those of ``shardq_system``, the tuned shardq when it ran (``HEADLINE_SHARDQ``)."""
    shardqs = [s for s in systems if is_shardq(s)]
    peers = [s for s in systems if not is_shardq(s)]
    lead = next((s for s in HEADLINE_SHARDQ if s in shardqs), shardqs[0] if shardqs else None)
    rows = []
    for scenario, metric, better, label in HEADLINE:
        per = summary.get(scenario, {}).get(metric, {})
        peer_medians = {p: per[p]["median"] for p in peers if p in per}
        row: dict[str, Any] = {"scenario": scenario, "metric": metric, "label": label,
                               "better": better, "best_peer": None, "best_peer_median": None,
                               "shardq_system": lead, "shardq": None,
                               "ratio_shardq_over_best_peer": None,
                               "shardq_variants": {}}  # fmt: skip
        if peer_medians:
            pick = max if better == "higher" else min
            best = pick(peer_medians, key=lambda p: peer_medians[p])
            row.update(best_peer=best, best_peer_median=peer_medians[best])
        for name in shardqs:
            if name not in per:
                continue
            median = per[name]["median"]
            ratio = round(median / row["best_peer_median"], 3) if row["best_peer_median"] else None
            row["shardq_variants"][name] = {"median": median, "ratio_over_best_peer": ratio}
            if name == lead:
                row.update(shardq=median, ratio_shardq_over_best_peer=ratio)
        rows.append(row)
    return rows


def yardstick(summary: dict[str, Any]) -> tuple[float | None, str]:
    """rq's single-submit rate (median), the machine's speed as this harness sees it: one
    producer process, redis-py and one Redis server, nothing of shardq's."""
    stats = summary.get("submit", {}).get("single_jobs_per_s", {}).get("rq")
    if stats:
        return stats["median"], "median of rq's submit / single_jobs_per_s in this run"
    return None, "rq's submit scenario did not run: no yardstick for this machine"


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


def header_lines(result: dict[str, Any]) -> list[str]:
    """What was measured and where: the commit, the machine, its yardstick."""
    commit = result.get("commit")
    if not commit:
        commit_text = "not recorded (a results file from before run.py recorded it)"
    elif not commit.get("sha"):
        commit_text = f"unknown ({commit.get('note', 'no git')})"
    else:
        dirty = commit.get("dirty_paths") or []
        state = f"dirty: {len(dirty)} changed paths at the start" if commit["dirty"] else "clean"
        commit_text = f"{commit['sha'][:12]} ({state}) in {commit.get('checkout')}"
    harness = result.get("harness_commit")
    if harness and harness.get("sha"):
        commit_text += f"; harness {harness['sha'][:12]} in {harness.get('checkout')}"
    machine = result.get("machine", {})
    cores = machine.get("cores") or machine.get("cpu_count")
    rate = machine.get("yardstick_rq_single_submit_per_s")
    if rate is None and "yardstick_rq_single_submit_per_s" not in machine:
        rate = yardstick(result.get("summary", {}))[0]  # an older file: from its summary
    rate_text = "none (rq's submit did not run)" if rate is None else f"{_fmt(rate)} jobs/s"
    return [
        f"commit: {commit_text}",
        f"machine: {machine.get('cpu_model') or 'CPU model unknown'}, {cores} cores; "
        f"yardstick (rq single submits): {rate_text}",
    ]


def tuning_lines(result: dict[str, Any]) -> list[str]:
    """Each system's knobs (the described tunings); none for a file from before them."""
    lines = []
    for name, described in result["systems"].items():
        if described.get("knobs") is not None:
            knobs = ", ".join(f"{k}={v}" for k, v in described["knobs"].items())
            lines.append(f"{name}: {described['tuning']} ({knobs})")
    return lines


def headline_lines(result: dict[str, Any], markdown: bool) -> list[str]:
    rows = result["headline"]
    # Every row's: a run without the first figure's scenario (drain alone) has it empty.
    variants = list(dict.fromkeys(v for h in rows for v in h.get("shardq_variants", {})))
    if not variants:  # a file from before the variants: its one shardq (the tuned one)
        variants = ["shardq"]
    lead = (rows[0].get("shardq_system") if rows else None) or variants[0]
    others = ", ".join(f"{v} / best peer" for v in variants if v != lead)
    lines = ["", f"headline: {lead} / best peer (the best over every peer system)"
                 + (f"; beside it {others}" if others else "") + ":"]  # fmt: skip
    if markdown:
        cols = [c for v in variants for c in (v, f"{v} / best peer")]
        lines += ["", "| figure | " + " | ".join(cols) + " | best peer |",
                  "|---|" + "---|" * (len(cols) + 1)]  # fmt: skip
    for h in rows:
        per = h.get("shardq_variants") or {
            "shardq": {
                "median": h["shardq"],
                "ratio_over_best_peer": h["ratio_shardq_over_best_peer"],
            }
        }  # an older file's row
        best = "-" if h["best_peer"] is None else f"{h['best_peer']} {_fmt(h['best_peer_median'])}"
        cells = []
        for v in variants:
            got = per.get(v) or {}
            median = got.get("median")
            ratio = got.get("ratio_over_best_peer")
            cells += ["-" if median is None else _fmt(median), "-" if ratio is None else str(ratio)]
        if markdown:
            lines.append(f"| {h['label']} | " + " | ".join(cells) + f" | {best} |")
        else:
            text = "  ".join(f"{v} {m:<10} ratio {r:<7}" for v, m, r in
                             zip(variants, cells[::2], cells[1::2], strict=True))  # fmt: skip
            lines.append(f"  {h['label']:<42} {text} best peer {best}")
    return lines


def render(result: dict[str, Any], markdown: bool = False) -> str:
    """The commit and machine, the table (one row per figure, one column per system), each
    system's knobs, then the headline."""
    rows = table_rows(result)
    head = header_lines(result)
    if markdown:
        lines = [f"- {line}" for line in head] + [""]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.insert(len(head) + 2, "|" + "---|" * len(rows[0]))
        lines += ["", "Cells: median [min–max] n=repeats."]
    else:
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [*head, ""]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(len(head) + 2, "  ".join("-" * w for w in widths))
        lines += ["", "cells: median [min–max] n=repeats"]
    tunings = tuning_lines(result)
    if tunings:
        lines += ["", "Tunings:", ""] if markdown else ["", "tunings:"]
        lines += [f"- {t}" if markdown else f"  {t}" for t in tunings]
    for name, described in result["systems"].items():
        if described.get("skipped") or described.get("error"):
            why = described.get("skipped") or described.get("error")
            lines.append(f"{name}: not measured ({why}) — no numbers reported")
    lines += headline_lines(result, markdown)
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
    ap.add_argument(
        "--shardq-tuning", choices=TUNING_CHOICES, default="both",
        help="shardq's workers at their defaults (--concurrency 16), tuned (200), or both "
        "(default: both, as shardq-tuned and shardq-defaults)",
    )  # fmt: skip
    ap.add_argument(
        "--peer-tuning", choices=TUNING_CHOICES, default="both",
        help="each peer with knobs at its library's defaults, with the equivalent of shardq's "
        "tuning, or both (default: both); rq has no knob and runs once",
    )  # fmt: skip
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
    rate, note = yardstick(summary)
    machine = {**ctx["machine"], "yardstick_rq_single_submit_per_s": rate, "yardstick_note": note}
    return {
        "schema": "shardq-bench/1",
        "complete": complete,  # false in the file written after each run while it goes on
        "command": ctx["command"],
        "started_at": ctx["started"],
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "quick": args.quick,
        "repeat": args.repeat,
        "scenarios": args.scenarios,
        "commit": ctx["commit"],
        **({"harness_commit": ctx["harness_commit"]} if ctx["harness_commit"] else {}),
        "tunings_asked": {"shardq": args.shardq_tuning, "peers": args.peer_tuning},
        "machine": machine,
        "services": ctx["services"],
        "systems": ctx["described"],
        "params": {s: (QUICK if args.quick else FULL)[s] for s in args.scenarios},
        "runs": runs,
        "summary": summary,
        "headline": headline(summary, list(ctx["described"])),
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
    commands = system_commands(args)
    answers = {name: call(cmd, {"op": "describe"}, timeout=120) for name, cmd in commands.items()}
    systems, described = expand_tunings(args, commands, answers)
    commit, harness_commit = commit_info(described)
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
            ctx: dict[str, Any]
            ctx = {"redis": redis, "tmp": tmp, "systems": systems, "described": described,
                   "commit": commit, "harness_commit": harness_commit,
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
