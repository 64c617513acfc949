"""The fenced blocks of README.md and docs/*.md, as tests/integration/test_docs.py runs them.

A block's language says what it is: ``sh``/``bash`` run as shell, ``python`` as a script;
``yaml`` must parse; ``text`` is shown, not run. Two HTML comments, on the line right before
a fence (blank lines between allowed), say more:

- ``<!-- not-run: REASON -->``: a block that needs what a test machine lacks (Kubernetes,
  Helm, Docker, grpcurl, an hour of benchmark); the reason is required;
- ``<!-- output -->`` before a ``text`` block: what the runnable block above it prints. Each
  line must appear in its output, in order; ``...`` in a line stands for any text.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from shardq.coordinator.tools.dev.processes import port_is_free
from shardq.coordinator.tools.redis_server import free_port
from tests.support.procs import ReadyLines

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
SHELL = frozenset({"sh", "bash"})
RUNNABLE = SHELL | {"python"}
#: Languages of blocks that show data or output, never run.
SHOWN = frozenset({"text", "yaml"})

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run:(.*?)-->\s*$")
_OUTPUT = re.compile(r"^<!--\s*output\s*-->\s*$")
_ANY_MARKER = re.compile(r"^<!--\s*(not-run|output)\b")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    #: "" when the block runs; else why not (from its not-run marker)
    not_run: str | None
    #: the expected output shown right after it (an ``<!-- output -->`` text block)
    output: str | None = None

    @property
    def id(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@dataclass(frozen=True)
class _Raw:
    line: int
    lang: str
    code: str
    marker: str  # the marker line before the fence ("" when none)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _raw_blocks(path: Path) -> list[_Raw]:
    lines = path.read_text().splitlines()
    out: list[_Raw] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = lines[j].strip() if j >= 0 and _ANY_MARKER.match(lines[j].strip()) else ""
        out.append(_Raw(start + 1, lang, "\n".join(body) + "\n", marker))
        i += 1
    return out


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``; an ``<!-- output -->`` block is folded into the one
    before it. Raises ValueError on a marker that says nothing or stands nowhere useful."""
    raws = _raw_blocks(path)
    out: list[Block] = []
    for raw in raws:
        where = f"{_shown(path)}:{raw.line}"
        if _OUTPUT.match(raw.marker):
            if raw.lang != "text" or not out or out[-1].lang not in RUNNABLE:
                raise ValueError(f"{where}: <!-- output --> must mark a text block after a run")
            prev = out.pop()
            out.append(Block(prev.path, prev.line, prev.lang, prev.code, prev.not_run, raw.code))
            continue
        not_run = None
        if raw.marker:
            m = _NOT_RUN.match(raw.marker)
            if m is None:
                raise ValueError(f"{where}: unreadable marker {raw.marker!r}")
            not_run = m.group(1).strip()
            if not not_run:
                raise ValueError(f"{where}: <!-- not-run: --> needs a reason")
        out.append(Block(path, raw.line, raw.lang, raw.code, not_run))
    return out


def all_blocks() -> list[Block]:
    return [b for path in documents() for b in blocks(path)]


def output_matches(expected: str, actual: str) -> bool:
    """Each line of ``expected`` matches a line of ``actual``, in order (``...``: any text)."""
    lines = actual.splitlines()
    pos = 0
    for want in filter(None, (w.strip() for w in expected.splitlines())):
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        while pos < len(lines) and not pattern.fullmatch(lines[pos].strip()):
            pos += 1
        if pos == len(lines):
            return False
        pos += 1
    return True


#: ``shardq dev``'s default --shards: the Redis ports it takes from --redis-base-port.
SHARDS_OF_DEV = 2


def free_port_run(n: int) -> int:
    """The first of ``n`` consecutive free ports, below Linux's ephemeral range (32768 up),
    where no outgoing connection of another process can take one between now and the
    start (one ephemeral port plus the next was a race: the next was often in use)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32768 - n)
        if all(port_is_free(base + i) for i in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports in 20000-32767")


class DevProcess:
    """``shardq dev`` as the README starts it (its defaults, the embedded Postgres), with HOME
    of its own (so the default data dir is new) and free ports (the machine is shared)."""

    def __init__(self, home: Path, port: int = 0, redis_base_port: int = 0) -> None:
        self.home = home
        self.port = port or free_port()
        self.redis_base_port = redis_base_port or free_port_run(SHARDS_OF_DEV)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SHARDQ_") and k not in ("XDG_CACHE_HOME", "VIRTUAL_ENV")
        }
        self.env.update(HOME=str(home), PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")
        dev_env = {
            **self.env,
            "SHARDQ_DEV_PORT": str(self.port),
            "SHARDQ_DEV_REDIS_BASE_PORT": str(self.redis_base_port),
        }
        self.process = ReadyLines(
            [str(VENV_BIN / "shardq"), "dev", "--no-live"], cwd=ROOT, env=dev_env
        )
        self.proc = self.process.proc

    @property
    def lines(self) -> list[str]:
        return self.process.lines

    def wait_ready(self, timeout_s: float = 180) -> None:
        self.process.wait_ready(timeout_s)

    @property
    def env_file(self) -> Path:
        return self.home / ".cache" / "shardq" / "dev" / "shardq.env"

    def stop(self) -> None:
        self.process.stop(signal.SIGINT, 60)
