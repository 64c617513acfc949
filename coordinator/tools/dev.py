"""``shardq dev``: a whole shardq cluster on this machine, in one command, until Ctrl-C.

It starts, as real processes of its own (each under ``setpriv --pdeathsig``, its own ``SHARDQ_*``
environment and a log file under ``<data-dir>/logs``):

- ``--shards`` ``redis-server`` processes with AOF on, data in ``<data-dir>/redis-<i>``, on
  ports ``--redis-base-port + i`` (fixed, so a restart finds the addresses of the shard map);
- Postgres: ``--database-url`` when given, else the server shipped by the ``pgserver`` wheel
  with its data in ``<data-dir>/postgres`` (run as the ``pgserver`` system user under root);
- the schema (``shardq migrate``), the shard map (``shardq shards sync``) and tokens, kept in
  ``<data-dir>/tokens.json`` so a restart reuses them;
- one coordinator (``python -m shardq.coordinator.server``), one shard loop per shard
  (``python -m shard``) and ``--workers`` workers (``python -m worker``) on the example
  handlers (``shardq.worker.examples``) or ``--handlers``.

Once every process answers it prints one line starting with ``shardq dev ready``, then how to
use the cluster, then a live view (or a status line every few seconds with ``--no-live`` or
when stdout is not a terminal). SIGINT, SIGTERM and SIGHUP stop everything it started, workers
first; ``<data-dir>/pids.json`` names every process while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import importlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psycopg

from shardq.client import AsyncClient, RetryPolicy
from shardq.common import validation
from shardq.common.errors import InvalidArgument
from shardq.coordinator.shardmap import MapNotInitialized, ShardMapStore
from shardq.coordinator.tokens import TokenStore
from shardq.coordinator.tools.redis_server import RedisProcess, free_port, parent_death_prefix
from shardq.store import db
from shardq.store.migrate import upgrade
from shardq.v1 import common_pb2

READY_LINE = "shardq dev ready"
DEFAULT_HANDLERS = "shardq.worker.examples"


def default_data_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "shardq" / "dev"


def _env_default(flag: str, default: Any, type: Callable[[str], Any] = str) -> Any:
    """``shardq dev`` flags default to ``SHARDQ_DEV_<FLAG>`` (not the components' variables:
    ``SHARDQ_SHARDS`` already means a worker's static shards)."""
    raw = os.environ.get("SHARDQ_DEV_" + flag.lstrip("-").replace("-", "_").upper())
    return type(raw) if raw not in (None, "") else default


def _opt(flag: str, default: Any, help: str, type: Callable[[str], Any] = str, **kw: Any) -> Any:
    var = "SHARDQ_DEV_" + flag.lstrip("-").replace("-", "_").upper()
    value = _env_default(flag, default, type)
    options = {"default": value, "help": f"{help} [{var}; default {default!r}]", **kw}
    if type is not str:
        options["type"] = type
    return ((flag,), options)


#: ``shardq dev``'s arguments as ``(flags, add_argument options)``; cli.py registers them.
ARGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    _opt("--shards", 2, "Redis shards to run", int),
    _opt("--workers", 2, "worker processes", int),
    _opt("--port", 50051, "the coordinator's gRPC port on 127.0.0.1", int),
    _opt(
        "--data-dir",
        str(default_data_dir()),
        "working folder: Redis AOF, Postgres, tokens, logs",
    ),
    _opt(
        "--redis-base-port",
        6390,
        "shard i's Redis listens on this port + i",
        int,
    ),
    _opt(
        "--database-url",
        "",
        "Postgres to use (empty: an embedded pgserver in the data dir)",
    ),
    (
        ("--token",),
        {
            "action": "append",
            "default": [],
            "metavar": "TENANT=TOKEN",
            "help": "a tenant and its token (sq_<12 hex>_<43 chars>); repeatable "
            "(default: a generated token for tenant 'demo')",
        },
    ),
    _opt("--admin-token", "", "the admin token to register (empty: a generated one)"),
    _opt("--handlers", DEFAULT_HANDLERS, "module(s) of the workers' handlers, comma-separated"),
    _opt("--key-prefix", "shardq", "prefix of every Redis key"),
    _opt("--concurrency", 16, "handlers each worker runs at once", int),
    _opt("--log-level", "INFO", "the processes' log level (their logs: <data-dir>/logs)"),
    _opt("--status-interval-s", 5.0, "seconds between status lines without the live view", float),
    (("--no-live",), {"action": "store_true", "help": "status lines instead of the live view"}),
    (("--demo",), {"action": "store_true", "help": "submit the `shardq demo` workload once up"}),
]


class DevError(Exception):
    """Why the cluster could not start, said in one line (exit code 1)."""


# -- processes --------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    #: /healthz port (shard loops and workers), 0 when the process has none.
    ops_port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid


def _child_env(values: dict[str, object]) -> dict[str, str]:
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


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _healthz(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body
    except (OSError, ValueError):
        return None


class EmbeddedPostgres:
    """PostgreSQL from the ``pgserver`` wheel, run as a child process (not daemonized by
    ``pg_ctl``), so it stops with ``shardq dev`` and dies with it. Under root it runs as the
    ``pgserver`` system user, which pgserver creates; it listens on 127.0.0.1 only."""

    def __init__(self, pgdata: Path, log: Path) -> None:
        self.pgdata = pgdata
        self.log = log
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self, timeout_s: float = 60.0) -> str:
        try:
            # Untyped helpers of the wheel: where its binaries are, initdb, the system user.
            with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
                warnings.simplefilter("ignore")
                _commands: Any = importlib.import_module("pgserver._commands")
                utils: Any = importlib.import_module("pgserver.utils")
        except ImportError as exc:
            raise DevError(
                f"no embedded Postgres ({exc}): `pip install pgserver`, or pass --database-url"
            ) from exc
        bin_path: Path = _commands.POSTGRES_BIN_PATH
        user = None
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:  # postgres refuses to run as root
            user = "pgserver"
            entry = utils.ensure_user_exists(user)
            utils.ensure_prefix_permissions(self.pgdata)
            utils.ensure_prefix_permissions(bin_path)
            utils.ensure_folder_permissions(bin_path, 0o055)
            utils.ensure_folder_permissions(bin_path.parent / "lib", 0o044)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        if not (self.pgdata / "PG_VERSION").exists():
            _commands.initdb(
                ["--auth=trust", "--encoding=utf8", "--no-sync", "-U", "postgres"],
                pgdata=self.pgdata,
                user=user,
            )
        self.port = free_port()
        with open(self.log, "ab") as log:
            log.write(f"--- shardq dev: postgres on port {self.port}\n".encode())
            log.flush()
            # No Unix socket (-k ""): the data dir's path may be too long for one.
            argv = [str(bin_path / "postgres"), "-D", str(self.pgdata), "-h", "127.0.0.1"]
            self.proc = subprocess.Popen(
                [*parent_death_prefix(), *argv, "-p", str(self.port), "-k", ""],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DevError(
                    f"postgres exited with {self.proc.returncode}; its log {self.log}:\n"
                    + tail(self.log)
                )
            try:
                with psycopg.connect(self.url, connect_timeout=1):
                    return self.url
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise DevError(f"postgres did not answer within {timeout_s:.0f}s; see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: clients are gone by now
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# -- tokens -----------------------------------------------------------------------------------


@dataclass
class Tokens:
    admin: str
    worker: str
    tenants: dict[str, str] = field(default_factory=dict)


def parse_token_args(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        tenant, sep, token = item.partition("=")
        if not sep or not token:
            raise DevError(f"--token {item!r} is not TENANT=TOKEN")
        try:
            validation.tenant_id(tenant)
        except InvalidArgument as exc:
            raise DevError(f"--token {item!r}: {exc}") from exc
        out[tenant] = token
    return out


def load_tokens(path: Path, args: argparse.Namespace) -> Tokens:
    """The flags' tokens, else the ones a previous run stored, else new ones."""
    stored: dict[str, Any] = {}
    if path.exists():
        with contextlib.suppress(ValueError, OSError):
            stored = json.loads(path.read_text())
    given = parse_token_args(args.token)
    tenants = given or dict(stored.get("tenants") or {}) or {"demo": ""}
    return Tokens(
        admin=args.admin_token or stored.get("admin", ""),
        worker=stored.get("worker") or secrets.token_urlsafe(32),
        tenants=tenants,
    )


async def register_tokens(store: TokenStore, tokens: Tokens) -> None:
    """Make every token valid in the database: generate the missing, register the given."""

    async def ensure(role: str, tenant: str | None, token: str) -> str:
        if token:
            principal = await store.authenticate(token)
            if principal is not None:
                if (principal.role, principal.tenant_id) != (role, tenant):
                    raise DevError(f"token {principal.token_id} belongs to another role or tenant")
                return token
            try:
                await store.create(role, tenant, name="shardq dev", token=token)
            except InvalidArgument as exc:
                raise DevError(f"{'admin' if role == 'admin' else tenant} token: {exc}") from exc
            return token
        return (await store.create(role, tenant, name="shardq dev"))[1]

    tokens.admin = await ensure("admin", None, tokens.admin)
    for tenant in sorted(tokens.tenants):
        tokens.tenants[tenant] = await ensure("tenant", tenant, tokens.tenants[tenant])


def save_tokens(path: Path, tokens: Tokens) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"admin": tokens.admin, "worker": tokens.worker, "tenants": tokens.tenants}, f)


# -- the cluster ------------------------------------------------------------------------------


class DevCluster:
    """Everything ``shardq dev`` starts, and the order it stops it in."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data_dir = Path(args.data_dir).expanduser().resolve()
        self.logs = self.data_dir / "logs"
        self.target = f"127.0.0.1:{args.port}"
        self.database_url = ""
        self.tokens: Tokens | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.redis: list[RedisProcess] = []
        self.children: list[Child] = []
        self._lock: IO[str] | None = None

    # Processes are started from the main thread only: PR_SET_PDEATHSIG fires when the thread
    # that forked the child ends, so a child forked from a worker thread could die early.
    def spawn(self, name: str, module: str, env: dict[str, object], ops_port: int = 0) -> Child:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as f:
            f.write(f"--- shardq dev: starting {name} at {time.ctime()}\n".encode())
            f.flush()
            proc = subprocess.Popen(
                [*parent_death_prefix(), sys.executable, "-m", module],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=_child_env(env),
                start_new_session=True,  # Ctrl-C reaches only `shardq dev`, which stops in order
            )
        child = Child(name, proc, log, ops_port)
        self.children.append(child)
        self.write_pids()
        return child

    def pids(self) -> dict[str, int]:
        out = {f"redis-{i}": r.proc.pid for i, r in enumerate(self.redis) if r.proc is not None}
        if self.postgres is not None and self.postgres.proc is not None:
            out["postgres"] = self.postgres.proc.pid
        out.update({c.name: c.pid for c in self.children})
        return out

    def write_pids(self, running: bool = True) -> None:
        doc = {"dev": os.getpid(), "running": running, "processes": self.pids()}
        tmp = self.data_dir / "pids.json.tmp"
        tmp.write_text(json.dumps(doc, indent=2))
        tmp.replace(self.data_dir / "pids.json")

    def lock_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._lock = open(self.data_dir / "dev.lock", "w")  # noqa: SIM115 - held while running
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DevError(
                f"another `shardq dev` is running on {self.data_dir}; stop it or pass --data-dir"
            ) from exc

    def check_ports(self) -> None:
        ports = {"--port": [self.args.port]}
        ports["--redis-base-port"] = [
            self.args.redis_base_port + i for i in range(self.args.shards)
        ]
        for flag, wanted in ports.items():
            busy = [p for p in wanted if not port_is_free(p)]
            if busy:
                raise DevError(
                    f"port {', '.join(map(str, busy))} is in use; pick others with {flag}"
                )

    async def start(self, stopping: asyncio.Event) -> None:
        args = self.args
        if args.shards < 1 or args.workers < 0:
            raise DevError("--shards must be at least 1 and --workers at least 0")
        self.lock_data_dir()
        self.check_ports()
        self.tokens = load_tokens(self.data_dir / "tokens.json", args)
        steps: list[Callable[[], Any]] = [
            self._start_database,
            self._start_redis,
            self._prepare_database,
            self._start_coordinator,
            self._start_shard_loops,
            self._start_workers,
            self._wait_until_serving,
        ]
        for step in steps:
            if stopping.is_set():
                return
            result = step()
            if asyncio.iscoroutine(result):
                await result

    def _start_database(self) -> None:
        if self.args.database_url:
            self.database_url = self.args.database_url
            return
        self.postgres = EmbeddedPostgres(self.data_dir / "postgres", self.logs / "postgres.log")
        try:
            self.database_url = self.postgres.start()
        finally:
            self.write_pids()

    def _start_redis(self) -> None:
        for i in range(self.args.shards):
            log = self.logs / f"redis-{i}.log"
            proc = RedisProcess(
                port=self.args.redis_base_port + i,
                data_dir=self.data_dir / f"redis-{i}",
                appendonly=True,
                extra_args=["--logfile", str(log), "--loglevel", "notice"],
            )
            try:
                proc.start()
            except (RuntimeError, TimeoutError) as exc:
                raise DevError(f"redis-server for shard {i}: {exc} (log: {log})") from exc
            finally:
                self.redis.append(proc)
                self.write_pids()

    async def _prepare_database(self) -> None:
        try:
            await asyncio.to_thread(upgrade, self.database_url)
        except Exception as exc:
            raise DevError(f"cannot migrate {self.database_url}: {exc}") from exc
        engine = db.make_engine(db.sqlalchemy_url(self.database_url))
        try:
            addresses = [f"127.0.0.1:{r.port}" for r in self.redis]
            store = ShardMapStore(engine)
            with contextlib.suppress(MapNotInitialized):
                count = len((await store.load()).shards)
                # Growing the map moves slots, and the tenants on them would leave their
                # queued jobs behind: a local cluster keeps its shard count.
                if count != len(addresses):
                    raise DevError(
                        f"this cluster has {count} shards (its shard map is in "
                        f"{'the data dir' if self.postgres else self.database_url}); "
                        f"pass --shards {count}, or another --data-dir (and database)"
                    )
            await store.sync_shards(addresses)
            assert self.tokens is not None
            await register_tokens(TokenStore(engine), self.tokens)
        finally:
            await engine.dispose()
        save_tokens(self.data_dir / "tokens.json", self.tokens)

    def _common_env(self) -> dict[str, object]:
        return {
            "SHARDQ_DATABASE_URL": self.database_url,
            "SHARDQ_KEY_PREFIX": self.args.key_prefix,
            "SHARDQ_LOG_LEVEL": self.args.log_level,
        }

    def _start_coordinator(self) -> None:
        assert self.tokens is not None
        self.spawn(
            "coordinator",
            "shardq.coordinator.server",
            {
                **self._common_env(),
                "SHARDQ_LISTEN": self.target,
                "SHARDQ_WORKER_TOKEN": self.tokens.worker,
                "SHARDQ_SHUTDOWN_GRACE_S": 2,
                "SHARDQ_METRICS_PORT": free_port(),
            },
        )

    def _start_shard_loops(self) -> None:
        for i, r in enumerate(self.redis):
            port = free_port()
            env = {
                **self._common_env(),
                "SHARDQ_REDIS_URL": r.url,
                "SHARDQ_SHARD_ID": i,
                "SHARDQ_METRICS_PORT": port,
                "SHARDQ_INSTANCE_ID": f"dev-shard-{i}",
            }
            self.spawn(f"shard-{i}", "shardq.shard", env, port)

    def _start_workers(self) -> None:
        assert self.tokens is not None
        for i in range(self.args.workers):
            port = free_port()
            env = {
                **self._common_env(),
                "SHARDQ_HANDLERS": self.args.handlers,
                "SHARDQ_COORDINATOR": self.target,
                "SHARDQ_WORKER_TOKEN": self.tokens.worker,
                "SHARDQ_WORKER_ID": f"dev-worker-{i}",
                "SHARDQ_CONCURRENCY": self.args.concurrency,
                "SHARDQ_LEASE_MS": 10_000,
                "SHARDQ_DRAIN_GRACE_S": 5,
                "SHARDQ_METRICS_PORT": port,
            }
            self.spawn(f"worker-{i}", "shardq.worker", env, port)

    async def _wait_until_serving(self, timeout_s: float = 60.0) -> None:
        """Until the coordinator answers, every shard loop is up and every worker has shards."""
        assert self.tokens is not None
        deadline = time.monotonic() + timeout_s
        pending = {c.name for c in self.children}
        async with AsyncClient(
            self.target, self.tokens.admin, retry=RetryPolicy(attempts=1), timeout_s=2
        ) as client:
            while pending:
                self.check_children()
                for child in self.children:
                    if child.name in pending and await self._serving(child, client):
                        pending.discard(child.name)
                if not pending:
                    return
                if time.monotonic() > deadline:
                    raise DevError(
                        f"not up within {timeout_s:.0f}s: {', '.join(sorted(pending))} "
                        f"(logs in {self.logs})"
                    )
                await asyncio.sleep(0.1)

    @staticmethod
    async def _serving(child: Child, client: AsyncClient) -> bool:
        if child.name == "coordinator":
            try:
                await client.shard_map()
            except Exception:  # not listening yet
                return False
            return True
        health = await asyncio.to_thread(_healthz, child.ops_port)
        if health is None:
            return False
        return bool(health.get("shards")) if child.name.startswith("worker") else True

    def check_children(self) -> None:
        """Raise when a process exited on its own (with the end of its log)."""
        for child in self.children:
            code = child.proc.poll()
            if code is not None:
                raise DevError(
                    f"{child.name} exited with code {code}; the end of {child.log}:\n"
                    + tail(child.log)
                )
        for i, r in enumerate(self.redis):
            if r.proc is None or r.proc.poll() is not None:
                raise DevError(f"redis-server of shard {i} exited; see {self.logs}/redis-{i}.log")
        pg = self.postgres.proc if self.postgres is not None else None
        if pg is not None and pg.poll() is not None:
            raise DevError(f"postgres exited; see {self.logs}/postgres.log")

    def stop(self) -> None:
        """Stop everything, in the order data flows backwards: workers drain first."""
        order = ("worker-", "shard-", "coordinator")
        for prefix in order:
            group = [c for c in self.children if c.name.startswith(prefix)]
            for c in group:
                if c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            for c in group:
                _wait_or_kill(c.proc, 15)
        for r in self.redis:
            r.stop()
        if self.postgres is not None:
            self.postgres.stop()
        if self._lock is not None:
            self.write_pids(running=False)
            self._lock.close()
            self._lock = None


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# -- what it prints ---------------------------------------------------------------------------


def shardq_command() -> str:
    """How to call the `shardq` CLI from a shell here: bare when PATH finds this one."""
    ours = Path(sys.executable).parent / "shardq"
    found = shutil.which("shardq")
    if found and ours.exists() and Path(found).resolve() == ours.resolve():
        return "shardq"
    return str(ours) if ours.exists() else "shardq"


def ready_text(cluster: DevCluster) -> str:
    tokens = cluster.tokens
    assert tokens is not None
    args = cluster.args
    tenant, token = sorted(tokens.tenants.items())[0]
    db_note = cluster.database_url if args.database_url else f"embedded ({cluster.database_url})"
    sq = shardq_command()
    conn = f"--coordinator {cluster.target} --token {token}"
    lines = [
        f"{READY_LINE}: coordinator {cluster.target}, {args.shards} shards, "
        f"{args.workers} workers, data in {cluster.data_dir}",
        "",
        f"  coordinator   {cluster.target}",
        f"  admin token   {tokens.admin}",
        *(f"  tenant {t} token   {tok}" for t, tok in sorted(tokens.tenants.items())),
        f"  postgres      {db_note}",
        f"  shards        {', '.join(f'127.0.0.1:{r.port}' for r in cluster.redis)}",
        f"  handlers      {args.handlers}",
        f"  logs          {cluster.logs}/",
        "",
        f"Submit a job (tenant {tenant}):",
        f'  {sq} submit echo \'{{"hello": "world"}}\' {conn}',
        f"  {sq} watch JOB_ID {conn}",
        "",
        "From Python:",
        "  from shardq import Client",
        f'  with Client("{cluster.target}", token="{token}") as c:',
        '      job = c.submit("flaky", {"fail_times": 2})',
        "      print(c.wait(job.job_id))",
        "",
        f"A mixed workload (tenants, priorities, delays, retries, a dead letter): "
        f"{sq} demo --coordinator {cluster.target} --token {tokens.admin}",
        "Stop: Ctrl-C (stops every process above; data stays in the data dir)",
    ]
    return "\n".join(lines)


@dataclass
class Snapshot:
    at: float
    #: per shard: scheduled, ready, active, dead, submitted, completed, failed, tenants
    shards: dict[int, list[int]]
    tenants: list[common_pb2.TenantStats]

    def total(self, column: int) -> int:
        return sum(row[column] for row in self.shards.values())


COLUMNS = ("scheduled", "ready", "active", "dead", "submitted", "completed", "failed", "tenants")


async def snapshot(client: AsyncClient, shard_count: int) -> Snapshot:
    tenants: list[common_pb2.TenantStats] = []
    token = ""
    while True:
        page = await client.list_tenant_stats(page_size=1000, page_token=token)
        tenants += page.tenants
        token = page.next_page_token
        if not token:
            break
    shards = {i: [0] * len(COLUMNS) for i in range(shard_count)}
    for t in tenants:
        row = shards.setdefault(t.shard_id, [0] * len(COLUMNS))
        values = (
            t.scheduled, t.ready, t.active, t.dead,
            t.submitted_total, t.completed_total, t.failed_total, 1,
        )  # fmt: skip
        for i, v in enumerate(values):
            row[i] += v
    return Snapshot(time.monotonic(), shards, tenants)


def throughput(history: list[Snapshot], window_s: float = 5.0) -> float:
    """Jobs finished (succeeded or failed) per second over the last ``window_s``."""
    if len(history) < 2:
        return 0.0
    last = history[-1]
    first = next((s for s in history if last.at - s.at <= window_s), history[-2])
    if first is last:
        first = history[-2]
    done = (last.total(5) + last.total(6)) - (first.total(5) + first.total(6))
    return max(0.0, done / max(1e-9, last.at - first.at))


def status_line(snap: Snapshot, rate: float) -> str:
    parts = [f"{name}={snap.total(i)}" for i, name in enumerate(COLUMNS[:7])]
    return f"shardq dev status: {' '.join(parts)} throughput={rate:.1f}/s"


def live_view(snap: Snapshot, rate: float, cluster: DevCluster) -> Any:
    from rich.console import Group  # noqa: PLC0415 - only the live view needs rich
    from rich.table import Table  # noqa: PLC0415
    from rich.text import Text  # noqa: PLC0415

    shards = Table(title="jobs per shard", title_justify="left", expand=False)
    for name in ("shard", *COLUMNS):
        shards.add_column(name, justify="right")
    for sid, row in sorted(snap.shards.items()):
        cell = f"[bold red]{row[3]}[/]" if row[3] else "0"
        shards.add_row(str(sid), *map(str, row[:3]), cell, *map(str, row[4:]))
    tenants = Table(title="tenants", title_justify="left", expand=False)
    for name in ("tenant", "shard", *COLUMNS[:7]):
        tenants.add_column(name, justify="right")
    busiest = sorted(snap.tenants, key=lambda t: (-t.submitted_total, t.tenant_id))[:10]
    for t in busiest:
        tenants.add_row(
            t.tenant_id, str(t.shard_id),
            *map(str, (t.scheduled, t.ready, t.active, t.dead)),
            *map(str, (t.submitted_total, t.completed_total, t.failed_total)),
        )  # fmt: skip
    dead = snap.total(3)
    summary = Text.from_markup(
        f"throughput [bold]{rate:.1f}[/] jobs/s   finished {snap.total(5)}   "
        f"dead letters [{'bold red' if dead else 'green'}]{dead}[/]   "
        f"processes {len(cluster.pids())} up   (Ctrl-C stops)"
    )
    parts: list[Any] = [summary, shards]
    if busiest:
        parts.append(tenants)
    if dead:
        parts.append(
            Text(
                f"dead letters: {shardq_command()} dead list --tenant TENANT "
                f"--coordinator {cluster.target} --token ADMIN_TOKEN",
                style="dim",
            )
        )
    return Group(*parts)


# -- the command ------------------------------------------------------------------------------


@contextlib.contextmanager
def _signals_set(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Iterator[None]:
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    for sig in sigs:
        loop.add_signal_handler(sig, event.set)
    try:
        yield
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)


async def run(args: argparse.Namespace) -> int:
    """``shardq dev``: start, show progress until a signal, stop everything."""
    cluster = DevCluster(args)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    with _signals_set(loop, stopping):
        try:
            await cluster.start(stopping)
            if stopping.is_set():
                return 0
            print(ready_text(cluster), flush=True)
            await watch(cluster, stopping)
        except DevError as exc:
            _say(f"shardq dev: error: {exc}", sys.stderr)
            return 1
        except OSError:
            # The terminal went away (SIGHUP): writing to it fails; stopping must not.
            if not stopping.is_set():
                raise
        finally:
            _say("shardq dev: stopping")
            cluster.stop()
            _say("shardq dev: stopped")
    return 0


def _say(text: str, stream: IO[str] | None = None) -> None:
    """Print, unless the terminal is gone: nothing must keep the cluster from stopping."""
    with contextlib.suppress(OSError, ValueError):
        print(text, file=stream or sys.stdout, flush=True)


async def watch(cluster: DevCluster, stopping: asyncio.Event) -> None:
    args = cluster.args
    live = not args.no_live and sys.stdout.isatty()
    tokens = cluster.tokens
    assert tokens is not None
    say: Callable[[str], None] = lambda text: print(text, flush=True)  # noqa: E731
    demo_task: asyncio.Task[Any] | None = None
    async with AsyncClient(
        cluster.target, tokens.admin, retry=RetryPolicy(attempts=2), timeout_s=5
    ) as client:
        with contextlib.ExitStack() as stack:
            view = None
            if live:
                from rich.live import Live  # noqa: PLC0415 - only the live view needs rich

                view = stack.enter_context(Live(refresh_per_second=2, transient=False))
                say = view.console.print
            if args.demo:
                from shardq.coordinator.tools import demo  # noqa: PLC0415

                demo_task = asyncio.create_task(
                    demo.run_demo(cluster.target, tokens.admin, say=say)
                )
            try:
                await _refresh(cluster, client, stopping, view, say)
            finally:
                if demo_task is not None:
                    demo_task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await demo_task


async def _refresh(
    cluster: DevCluster,
    client: AsyncClient,
    stopping: asyncio.Event,
    view: Any,
    say: Callable[[str], None],
) -> None:
    interval = 1.0 if view is not None else max(0.2, cluster.args.status_interval_s)
    history: list[Snapshot] = []
    while not stopping.is_set():
        cluster.check_children()
        try:
            snap = await snapshot(client, cluster.args.shards)
        except Exception as exc:  # the coordinator is checked above; say why and go on
            say(f"shardq dev: stats unavailable: {' '.join(str(exc).split())[:200]}")
        else:
            history = [*history[-30:], snap]
            rate = throughput(history)
            if view is not None:
                view.update(live_view(snap, rate, cluster))
            else:
                say(status_line(snap, rate))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), interval)
