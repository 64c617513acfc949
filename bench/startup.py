"""How long the ``shardq`` command takes before it does anything: whole processes, timed from
outside, interleaved with ``python -c pass`` (the interpreter's own start) so a drifting
machine hits both alike, and the imports that cost the most (``python -X importtime``).

    .venv/bin/python bench/startup.py                  # --help of the command and of a few nouns
    .venv/bin/python bench/startup.py --get JOB_ID     # and `shardq get JOB_ID` (next to
                                                       # `shardq dev`: it reads its shardq.env)
    .venv/bin/python bench/startup.py --runs 21 --top 15
    .venv/bin/python bench/startup.py --programs --vs-bin /tmp/base/.venv/bin --out FILE.json
                                # the servers' start too, beside another checkout's scripts

Prints, per command, the wall and CPU seconds of each run as min / median / max and the
median's ratio to ``python -c pass``; quote medians. ``--programs`` adds ``--help`` of an
operator command that loads the database's modules and of the three servers (each has
imported everything when it parses its flags); ``--vs-bin DIR`` times the same commands of the
scripts in ``DIR`` (another checkout's venv) in the same turns, each named ``vs: ...``;
``--out`` writes the figures, with the commit, as JSON. ``--programs`` also times a worker
started by module both ways: through ``shardq._programs`` (as ``shardq dev`` does) and plain.
The targets of issue 16: ``shardq --help``
within 0.3 s and ``shardq get`` within 0.6 s on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent
BASELINE = [sys.executable, "-c", "pass"]


def once(argv: list[str]) -> tuple[float, float]:
    """(wall, cpu) seconds of one run of ``argv``, its output thrown away."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def measure(commands: dict[str, list[str]], runs: int) -> dict[str, list[tuple[float, float]]]:
    """Every command ``runs`` times after one warm-up each, in turn (A B C A B C ...)."""
    for argv in commands.values():
        once(argv)
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            out[name].append(once(argv))
    return out


def slowest_imports(argv: list[str], top: int) -> list[tuple[int, str]]:
    """The ``top`` imports with the largest cumulative time (µs) in one run of ``argv``."""
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split(":", 1)[1].split("|"))
        rows.append((int(cumulative), name))
    return sorted(rows, reverse=True)[:top]


def _commands(args: argparse.Namespace) -> dict[str, list[str]]:
    """The commands to time, by name, ``python -c pass`` first."""
    words = [["--help"], ["get", "--help"], ["tokens", "--help"]]
    if args.programs:
        words.append(["migrate", "--help"])
    scripts = {f"shardq {' '.join(w)}": ["shardq", *w] for w in words}
    if args.programs:
        for program in ("shardq-worker", "shardq-coordinator", "shardq-shard"):
            scripts[f"{program} --help"] = [program, "--help"]
    commands = {"python -c pass": BASELINE}
    for name, (script, *rest) in scripts.items():
        commands[name] = [str(BIN / script), *rest]
        if args.vs_bin:
            commands[f"vs: {name}"] = [str(args.vs_bin / script), *rest]
    if args.programs:
        # A worker as `shardq dev` starts one (by module, through shardq._programs) and as
        # plain `python -m` does, in this checkout.
        for module in ("shardq._programs shardq.worker", "shardq.worker"):
            commands[f"python -m {module} --help"] = [
                sys.executable,
                "-m",
                *module.split(),
                "--help",
            ]
    if args.get:
        commands[f"shardq get {args.get}"] = [str(BIN / "shardq"), "get", args.get]
    return commands


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=11, help="counted runs of each command")
    p.add_argument("--get", default="", metavar="JOB_ID", help="also time `shardq get JOB_ID`")
    p.add_argument("--top", type=int, default=10, help="slowest imports to list per command")
    p.add_argument("--programs", action="store_true", help="also the servers' --help")
    p.add_argument("--vs-bin", type=Path, help="also the same commands of the scripts in DIR")
    p.add_argument("--out", type=Path, help="JSON file for the figures")
    args = p.parse_args()
    commands = _commands(args)
    results = measure(commands, args.runs)
    base = statistics.median(w for w, _ in results["python -c pass"])
    print(f"{'command':<34} {'wall s min/median/max':>24} {'cpu s median':>13} {'x pass':>7}")
    figures = {}
    for name, rows in results.items():
        walls = sorted(w for w, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        med = statistics.median(walls)
        span = f"{walls[0]:.3f}/{med:.3f}/{walls[-1]:.3f}"
        print(f"{name:<34} {span:>24} {cpu:>13.3f} {med / base:>7.2f}")
        figures[name] = {"wall_s_min": round(walls[0], 4), "wall_s_median": round(med, 4),
                         "wall_s_max": round(walls[-1], 4), "cpu_s_median": round(cpu, 4),
                         "x_python_pass": round(med / base, 3)}  # fmt: skip
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                                text=True, check=False).stdout.strip()  # fmt: skip
        doc = {"commit": commit, "vs_bin": str(args.vs_bin or ""), "runs": args.runs,
               "results": figures}  # fmt: skip
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for name, argv in commands.items():
        if argv is BASELINE or name.startswith("vs: "):
            continue
        print(f"\nslowest imports of `{name}` (cumulative ms):")
        for us, module in slowest_imports([sys.executable, "-X", "importtime", *argv], args.top):
            print(f"  {us / 1000:8.1f}  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
