"""The processes ``shardq dev`` starts: each one's handle, environment and log, and the checks
around them (free ports, health endpoints, the end of a log).

Each runs under ``setpriv --pdeathsig`` (it dies with ``shardq dev``), in a session of its own
(Ctrl-C reaches only ``shardq dev``, which stops them in order), with a log file of its own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardq.coordinator.tools.redis_server import parent_death_prefix


class DevError(Exception):
    """Why the cluster could not start, said in one line (exit code 1)."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    #: /healthz port (shard loops and workers), 0 when the process has none.
    ops_port: int = 0
    #: What it was started with, so that it can be started again.
    module: str = ""
    env: dict[str, object] = field(default_factory=dict)
    #: Where this start's output begins in ``log`` (the log is kept from start to start).
    log_start: int = 0
    #: Earlier starts that exited because another program took the metrics port.
    lost_ports: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_child(
    name: str, module: str, env: dict[str, object], log: Path, ops_port: int = 0
) -> Child:
    """``python -m module`` with ``env`` as its only SHARDQ_* variables, its output in ``log``
    (through ``shardq._programs``: its imports with the garbage collector paused, a third of a
    server's start).

    Call it from the main thread only: PR_SET_PDEATHSIG fires when the thread that forked the
    child ends, so a child forked from a worker thread could die early."""
    with open(log, "ab") as f:
        f.write(f"--- shardq dev: starting {name} at {time.ctime()}\n".encode())
        f.flush()
        log_start = f.tell()
        proc = subprocess.Popen(
            [*parent_death_prefix(), sys.executable, "-m", "shardq._programs", module],
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            start_new_session=True,  # Ctrl-C reaches only `shardq dev`, which stops in order
        )
    return Child(name, proc, log, ops_port, module, dict(env), log_start)


def child_env(values: dict[str, object]) -> dict[str, str]:
    """This environment without any SHARDQ_* variable, plus the child's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in values.items()})
    return env


def port_is_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:port (TIME_WAIT sockets of a previous run don't count:
    redis-server and gRPC bind with SO_REUSEADDR too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def lost_port(log: Path, since: int, port: int) -> bool:
    """Whether the output from byte ``since`` of ``log`` on says binding ``port`` failed
    because it was in use (asyncio's error names the address, as ``('host', port)``)."""
    try:
        with log.open("rb") as f:
            f.seek(since)
            text = f.read().lower()
    except OSError:
        return False
    return b"address already in use" in text and f", {port})".encode() in text


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except (OSError, ValueError):
        return None


def wait_or_kill(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
