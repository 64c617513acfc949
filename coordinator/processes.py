"""``shardq-coordinator --processes N``: N coordinator processes behind one port.

One coordinator process serves gRPC on about one core: its event loop and grpcio's poller
thread take turns holding the GIL. To use more of a host, the supervisor here starts N
copies of the coordinator, each binding the same ``--listen`` address with SO_REUSEPORT, and
the kernel spreads new connections over them (a connection and every call on it stay with
one process, so a client with one channel uses one process; ``shardq.client`` opens one
channel per client). Nothing is shared between the copies that is not already shared between
coordinator replicas: everything durable is in Postgres and the shards, and the mover and the
retention purge are leased to one process of the cluster at a time.

- Child ``i`` serves /metrics, /healthz and /readyz on ``--metrics-port`` + ``i`` (one port
  cannot hold N HTTP servers whose answers differ).
- SIGTERM or SIGINT to the supervisor goes to every child, which drains as a single
  coordinator does; the supervisor exits 0 when they all have.
- If a child exits on its own, the supervisor stops the others and exits with that child's
  code: a crash-looping child is the process manager's to see and restart (Kubernetes,
  systemd), not hidden behind a supervisor that keeps respawning it.
- The supervisor starts no gRPC and holds no state; the children get SIGTERM if it dies
  (``setpriv --pdeathsig``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import FrameType

from shardq.coordinator.tools.redis_server import parent_death_prefix

log = logging.getLogger("shardq.coordinator")

#: Set in each child's environment: its index, and that it shares its port on purpose.
INDEX_VARIABLE = "SHARDQ_COORDINATOR_PROCESS_INDEX"


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a supervisor's coordinators), from /proc:
    what pgrep -P says, without needing pgrep."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # gone meanwhile
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return sorted(found)


def is_child() -> bool:
    """Whether this coordinator is one of a supervisor's N (so it binds with SO_REUSEPORT)."""
    return INDEX_VARIABLE in os.environ


def supervise(argv: list[str], processes: int, metrics_port: int) -> int:
    """Run ``processes`` coordinators with ``argv`` (each with ``--processes 1`` and its own
    metrics port) until they stop; the exit code."""
    children: dict[int, subprocess.Popen[bytes]] = {}
    for index in range(processes):
        port = metrics_port + index if metrics_port > 0 else metrics_port
        child = subprocess.Popen(
            [
                *parent_death_prefix(),
                sys.executable,
                "-m",
                "shardq._programs",  # its imports with the collector paused (a third of a start)
                "shardq.coordinator.server",
                *argv,
                # The last occurrence of a flag wins in argparse: these override argv's.
                "--processes",
                "1",
                "--metrics-port",
                str(port),
            ],
            env={**os.environ, INDEX_VARIABLE: str(index)},
        )
        children[child.pid] = child
    log.info("started %d coordinator processes: pids %s", processes, sorted(children))
    stopping = False

    def stop_all(signum: int, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.returncode is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    code = 0
    while any(child.returncode is None for child in children.values()):
        pid, status = os.wait()  # retried after a signal's handler runs (PEP 475)
        ended = children.get(pid)
        if ended is None:
            continue  # not ours (setpriv execs into the coordinator: same pid)
        ended.returncode = os.waitstatus_to_exitcode(status)
        if not stopping:
            # A child killed by a signal exits as a shell reports it: 128 + the signal.
            rc = ended.returncode
            code = 128 - rc if rc < 0 else rc or 1
            log.error(
                "coordinator process %d exited with %d: stopping the others",
                pid,
                ended.returncode,
            )
            stop_all(signal.SIGTERM)
    return code
