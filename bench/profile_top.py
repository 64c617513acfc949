"""Where the time goes in py-spy profiles (``--format raw``): the top functions by own time and
by inclusive time, over one or more files (e.g. both workers of a drain run).

    BENCH_SHARDQ_PROFILE=/tmp/prof python bench/run.py --peers --scenarios drain --repeat 1
    python bench/profile_top.py /tmp/prof/drain-*worker-*.txt [--top 25] [--match shardq]

Standard library only.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(.*) (\d+)$")
#: py-spy frames look like ``function (path/to/file.py:123)``; the line is dropped to
#: aggregate per function.
_FRAME = re.compile(r"^(.*?) \((.*?)(?::\d+)?\)$")


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if not m:
        return frame
    func, path = m.groups()
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{func} ({path})"


def load(paths: list[Path], skip: str = "") -> tuple[Counter[str], Counter[str], int]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            stack, count = m.group(1), int(m.group(2))
            if skip and skip in stack:
                continue
            frames = [_short(f) for f in stack.split(";") if f]
            if not frames:
                continue
            # py-spy's first frame is the thread ("process 123:"/"thread ..."); skip it.
            frames = [f for f in frames if not f.startswith(("process ", "thread "))]
            total += count
            if frames:
                own[frames[-1]] += count
            for f in set(frames):
                inclusive[f] += count
    return own, inclusive, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="", help="inclusive list: only frames containing this")
    ap.add_argument(
        "--skip", default="_find_and_load", help="drop samples whose stack has this (imports)"
    )
    args = ap.parse_args()
    own, inclusive, total = load(args.files, args.skip)
    print(f"{total} samples in {len(args.files)} files")
    print("\nown time:")
    for frame, n in own.most_common(args.top):
        print(f"  {100 * n / total:5.1f}%  {frame}")
    print("\ninclusive time:")
    shown = [(f, n) for f, n in inclusive.most_common() if args.match in f][: args.top]
    for frame, n in shown:
        print(f"  {100 * n / total:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
