"""Garbage-collection pauses of every Python process a command runs: at start-up and during
the run. A pause in the middle of a server's event loop makes whatever it serves that much
late, so a tail of lateness (a delayed job's start, a submit) is checked against them.

    python bench/gc_pauses.py [--min-ms 1] [--out FILE.json] -- COMMAND [ARG ...]

e.g. ``python bench/gc_pauses.py -- python bench/run.py --scenarios delayed --peers
--shardq-tuning defaults --repeat 4``. The command runs with ``bench/gc_probe/`` first on its
PYTHONPATH (so its ``sitecustomize`` is imported by every Python process it starts that
inherits the environment: the bench driver, the CLI, the coordinator, the shard loops, the
workers), which logs each collection of ``--min-ms`` or longer. The report: per kind of
process (its program's name), the processes seen, and the count, longest and total of the
pauses before and after a first ``gc.freeze()`` (the servers freeze what their imports made,
``shardq._programs``, then the rest of their start-up, ``shardq.common.config``; a process
started otherwise, only the latter), printed and written to ``--out``. Exits with the
command's status.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROBE = HERE / "gc_probe"


def read_pauses(log_dir: Path) -> list[dict[str, Any]]:
    """Every pause the probe logged in ``log_dir``."""
    pauses = []
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                pauses.append(json.loads(line))
    return pauses


def summarize(pauses: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of process: the processes, and the pauses before and after the freeze."""
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pauses:
        by_kind[p["process"]].append(p)
    report: dict[str, Any] = {}
    for kind, ps in sorted(by_kind.items()):
        entry: dict[str, Any] = {"processes": len({p["pid"] for p in ps})}
        for when, frozen in (("before_freeze", False), ("after_freeze", True)):
            ms = [p["ms"] for p in ps if p["after_freeze"] is frozen]
            entry[when] = {
                "pauses": len(ms),
                "max_ms": max(ms, default=0.0),
                "total_ms": round(sum(ms), 3),
                "full_collections": sum(
                    1 for p in ps if p["after_freeze"] is frozen and p["generation"] == 2
                ),
            }
        report[kind] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-ms", type=float, default=1.0, help="shortest pause logged (1)")
    parser.add_argument("--out", type=Path, help="JSON file for the report")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: -- COMMAND [ARG ...]")
    with tempfile.TemporaryDirectory(prefix="shardq-gc-") as log_dir:
        path = os.pathsep.join(filter(None, [str(PROBE), os.environ.get("PYTHONPATH")]))
        env = {
            **os.environ,
            "PYTHONPATH": path,
            "BENCH_GC_LOG_DIR": log_dir,
            "BENCH_GC_MIN_MS": str(args.min_ms),
        }
        status = subprocess.run(command, env=env, check=False).returncode
        pauses = read_pauses(Path(log_dir))
    report = {
        "command": command,
        "exit_status": status,
        "min_ms": args.min_ms,
        "by_process": summarize(pauses),
        "pauses": pauses,
    }
    print(json.dumps(report["by_process"], indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
