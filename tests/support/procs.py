"""Workers as real processes (for SIGKILL/SIGSTOP/SIGTERM tests), and a TCP proxy that can cut
a connection to Postgres without stopping the machine's server (other tests share it)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import IO, Any

from shardq.coordinator.tools.dev import READY_LINE
from shardq.coordinator.tools.redis_server import free_port, parent_death_prefix
from tests.support.cluster import Cluster


@dataclass
class WorkerProcess:
    worker_id: str
    proc: subprocess.Popen[bytes]
    metrics_port: int

    def health(self) -> dict[str, Any] | None:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as r:
                body: dict[str, Any] = json.loads(r.read())
                return body
        except OSError:
            return None

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def start_worker(
    cluster: Cluster,
    name: str,
    database_url: str | None = None,
    log: IO[bytes] | None = None,
    **flags: Any,
) -> WorkerProcess:
    """A worker process on ``cluster`` (its stderr, the JSON log lines, to ``log`` if given)."""
    port = free_port()
    env = {
        **os.environ,
        "SHARDQ_HANDLERS": "tests.support.handlers",
        "SHARDQ_COORDINATOR": cluster.target,
        "SHARDQ_WORKER_TOKEN": cluster.admin_token,
        "SHARDQ_DATABASE_URL": database_url or cluster.database_url,
        "SHARDQ_KEY_PREFIX": cluster.settings.shard.key_prefix,
        "SHARDQ_WORKER_ID": name,
        "SHARDQ_METRICS_PORT": str(port),
        "SHARDQ_LEASE_MS": "1000",
        "SHARDQ_DRAIN_GRACE_S": "5",
        "SHARDQ_LOG_LEVEL": os.environ.get("SHARDQ_TEST_WORKER_LOG_LEVEL", "WARNING"),
    }
    env.update({f"SHARDQ_{k.upper()}": str(v) for k, v in flags.items()})
    proc = subprocess.Popen(
        [*parent_death_prefix(), sys.executable, "-m", "shardq.worker"], env=env, stderr=log
    )
    return WorkerProcess(name, proc, port)


async def wait_until_serving(w: WorkerProcess, shards: int = 1, timeout_s: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        h = await asyncio.to_thread(w.health)
        if h and len(h.get("shards", [])) >= shards:
            return
        assert w.proc.poll() is None, f"worker {w.worker_id} exited with {w.proc.returncode}"
        assert loop.time() < deadline, f"worker {w.worker_id} never got {shards} shard(s): {h}"
        await asyncio.sleep(0.05)


class ReadyLines:
    """A process (``shardq dev``, ``bash .ci/dev``) whose output is collected line by line on a
    thread, and which is ready once it prints ``shardq dev``'s ready line."""

    def __init__(self, argv: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(
            [*parent_death_prefix(), *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **popen,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith(READY_LINE):
                self.ready.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self, timeout_s: float = 180, settle_s: float = 0.0) -> str:
        """The output so far, once ready; ``settle_s`` more for lines printed right after."""
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            assert self.proc.poll() is None, f"shardq dev exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"not ready in {timeout_s}s:\n{self.output}"
        time.sleep(settle_s)
        return self.output

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout_s: float = 60) -> int:
        """Its exit code after ``sig``; one that does not stop is killed and fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"shardq dev did not stop on {sig.name}:\n{self.output}") from None
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return code
