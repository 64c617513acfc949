"""Imported at start-up by every Python process that ``bench/gc_pauses.py`` runs (this folder
is put first on their PYTHONPATH): each garbage collection of ``BENCH_GC_MIN_MS`` or longer
is appended, as a JSON line, to a file of the process's own in ``BENCH_GC_LOG_DIR``, with
whether it came after a first ``gc.freeze()`` (``shardq._programs``, ``shardq.common.config``):
what a server's start-up made is frozen. Standard library only; nothing is written by a
process without a long collection."""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from typing import Any, TextIO

_DIR = os.environ.get("BENCH_GC_LOG_DIR", "")
_MIN_MS = float(os.environ.get("BENCH_GC_MIN_MS", "1.0"))


class _Probe:
    """The collection under way's start, and the process's log (opened at its first line)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.out: TextIO | None = None
        self.name = ""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.started = time.perf_counter()
            return
        ms = (time.perf_counter() - self.started) * 1000
        if ms < _MIN_MS:
            return
        if self.out is None:
            self.name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
            path = os.path.join(_DIR, f"{self.name}-{os.getpid()}.jsonl")
            self.out = open(path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
        record = {
            "process": self.name,
            "pid": os.getpid(),
            "unix_s": round(time.time(), 3),
            "generation": info["generation"],
            "ms": round(ms, 3),
            "after_freeze": gc.get_freeze_count() > 0,
        }
        self.out.write(json.dumps(record) + "\n")


if _DIR:
    gc.callbacks.append(_Probe())
