"""The chart's Sentinel mode and its Redis password, rendered by the real helm and, for the
scripts the pods start with, run against real redis-server and redis-sentinel processes:

- a shard's replicas are kept off the host of its primary pod and of each other;
- sentinels that all restart at once take the shard's primary from its Redis (a promoted
  replica), not from the pod that was primary first, and so does a shard Redis restarted
  while no sentinel answers;
- no command line carries the Redis password (``ps`` shows every argv on the node).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from shardq.coordinator.tools.redis_server import RedisProcess, free_port
from tests.helm.conftest import VALUES_DIR, VALUES_FILES, Doc, Rendered, run_helm, template_args
from tests.helm.test_chart import FULLNAME, container, pod_specs

Render = Callable[[str], Rendered]
PASSWORD = 'pa ss"wo\\rd'  # a space, a quote and a backslash: written into a config string


def _render(helm: str, yaml_mod: ModuleType, *sets: str) -> Rendered:
    extra = [arg for s in sets for arg in ("--set", s)]
    proc = run_helm(helm, *template_args([VALUES_DIR / "sentinel.yaml"], extra))
    assert proc.returncode == 0, proc.stderr
    return Rendered(
        "sentinel+" + ",".join(sets), [d for d in yaml_mod.safe_load_all(proc.stdout) if d]
    )


def _anti_affinity_terms(spec: Doc, kind: str) -> list[Doc]:
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    if kind == "preferred":
        return [
            t["podAffinityTerm"]
            for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution", [])
        ]
    terms: list[Doc] = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    return terms


@pytest.mark.parametrize(("preset", "kind"), [("soft", "preferred"), ("hard", "required")])
def test_a_shards_replicas_stay_off_the_host_of_its_primary_pod_and_of_each_other(
    helm: str, yaml_mod: ModuleType, preset: str, kind: str
) -> None:
    r = _render(helm, yaml_mod, f"shards.podAntiAffinityPreset={preset}")
    primary = r.get("StatefulSet", f"{FULLNAME}-shard")
    primary_labels = primary["spec"]["template"]["metadata"]["labels"]
    for i in range(2):
        replicas = r.get("StatefulSet", f"{FULLNAME}-shard-{i}-replica")
        template = replicas["spec"]["template"]
        terms = _anti_affinity_terms(template["spec"], kind)
        assert all(t["topologyKey"] == "kubernetes.io/hostname" for t in terms)
        selectors = [t["labelSelector"]["matchLabels"] for t in terms]
        # Pod i of the shard StatefulSet (Kubernetes labels it with its index), and no other.
        pod_i = {**primary_labels, "apps.kubernetes.io/pod-index": str(i)}
        pod_other = {**primary_labels, "apps.kubernetes.io/pod-index": str(1 - i)}
        assert any(sel.items() <= pod_i.items() for sel in selectors), selectors
        assert not any(sel.items() <= pod_other.items() for sel in selectors), selectors
        # The replicas of the same shard.
        assert any(sel.items() <= template["metadata"]["labels"].items() for sel in selectors)


def test_without_a_preset_the_chart_sets_no_anti_affinity(helm: str, yaml_mod: ModuleType) -> None:
    r = _render(helm, yaml_mod, "shards.podAntiAffinityPreset=none")
    replicas = r.get("StatefulSet", f"{FULLNAME}-shard-0-replica")
    assert "affinity" not in replicas["spec"]["template"]["spec"]


# --- the password on no command line ----------------------------------------------------------


def _argv(c: Doc) -> str:
    return " ".join(map(str, [*c.get("command", []), *c.get("args", [])]))


@pytest.mark.parametrize("name", VALUES_FILES)
def test_no_container_has_the_redis_password_on_its_command_line(render: Render, name: str) -> None:
    r = render(name)
    secrets = [d for d in r.kind("Secret") if "redis-password" in d.get("data", {})]
    values = {base64.b64decode(d["data"]["redis-password"]).decode() for d in secrets}
    for doc, spec in pod_specs(r):
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            argv = _argv(c)
            where = f"{name}: {doc['metadata']['name']}/{c['name']}"
            assert "$(REDIS_PASSWORD)" not in argv, where
            assert "$(SHARDQ_REDIS_PASSWORD)" not in argv, where
            assert not any(v and v in argv for v in values), where
    # Nor do the scripts pass it to a program: only shell builtins (printf, echo) see it.
    for cm in r.kind("ConfigMap"):
        for key, text in cm.get("data", {}).items():
            for line in str(text).splitlines():
                if "REDIS_PASSWORD" in line and "$REDIS_PASSWORD" in line:
                    assert line.strip().startswith(("pw=$(printf '%s' \"$REDIS_PASSWORD\" |",)), (
                        f"{name}: {cm['metadata']['name']}/{key}: {line.strip()}"
                    )


@contextlib.contextmanager
def _started(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    # Its own process group: start-redis.sh may run redis-server as its child (while the shard
    # elects its primary), which must not outlive the test, however the script ends.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.stderr:
            proc.stderr.close()


def _answering(port: int, password: str | None, proc: subprocess.Popen[bytes]) -> Any:
    """PING on ``port`` with ``password`` until it answers (the process must stay up)."""
    client = redis.Redis(port=port, password=password, socket_timeout=2)
    for _ in range(500):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
            if client.ping():
                return client
        time.sleep(0.02)
    raise AssertionError(f"nothing answers on port {port}")


def _redis_command(c: Doc, tmp: Path, port: int, data_dir: Path | None = None) -> list[str]:
    """The Redis container's command and args, with this machine's port and data dir (``tmp``,
    which holds the start script, unless ``data_dir`` is given)."""
    # (Kubernetes expands $(POD_FQDN) in args: here every pod is 127.0.0.1)
    args = [str(a).replace("$(POD_FQDN)", "127.0.0.1") for a in c["args"]]
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(data_dir or tmp)
    command = [str(a) for a in c["command"]]
    if command[:2] == ["sh", "/scripts/start-redis.sh"]:
        command = ["sh", str(tmp / "start-redis.sh")]
    return [*command, *args, "--bind", "127.0.0.1"]


@pytest.mark.parametrize("name", ["default", "sentinel"])
def test_a_shard_redis_started_by_the_chart_requires_the_password_it_never_shows(
    render: Render, name: str, tmp_path: Path, redis_bin: Path
) -> None:
    """The shard's Redis container, run here as the pod runs it (its command and args, the
    password in its environment): the password is required and on no process's argv."""
    r = render(name)
    sts = r.get("StatefulSet", f"{FULLNAME}-shard")
    c = container(sts["spec"]["template"]["spec"], "redis")
    if name == "sentinel":
        scripts = r.get("ConfigMap", f"{FULLNAME}-sentinel-scripts")["data"]
        (tmp_path / "start-redis.sh").write_text(scripts["start-redis.sh"])
    port = free_port()
    env = {
        # The names the scripts run (redis-server, redis-cli), as in the pod's image.
        "PATH": f"{redis_bin}{os.pathsep}{os.environ['PATH']}",
        "TMPDIR": str(tmp_path),
        "REDIS_PASSWORD": PASSWORD,
        "REDISCLI_AUTH": PASSWORD,
        # Sentinel mode: no sentinel answers, and this pod is the shard's first primary.
        "SENTINELS": f"127.0.0.1:{free_port()}",
        "SHARD_MASTER": "m",
        "SHARD_INDEX": "0",
        "SHARD_REDIS_HOSTS": f"127.0.0.1:{port}",  # nor any other Redis of the shard
        "POD_FQDN": "127.0.0.1",
        "REDIS_PORT": str(port),
        "KEY_PREFIX": "shardq",
        "WHOLE_SHARD_WAIT_S": "60",
    }
    with _started(_redis_command(c, tmp_path, port), env) as proc:
        client = _answering(port, PASSWORD, proc)
        try:
            # (a read: in Sentinel mode a primary without replicas refuses writes)
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=port, socket_timeout=2).get("k")
            assert client.get("k") is None
            for pid in filter(str.isdigit, os.listdir("/proc")):
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    assert PASSWORD.encode() not in cmdline, cmdline
            conf = tmp_path / "redis-auth.conf"
            assert conf.stat().st_mode & 0o077 == 0, "readable by the pod's owner only"
        finally:
            client.close()


# --- sentinels that all restart at once ---------------------------------------------------------


def test_sentinels_restarted_together_find_the_promoted_replica_not_the_first_pod(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Shard 0 failed over (its replica promoted, its first pod now a replica), then every
    sentinel restarted: the chart's start-sentinel.sh, run against the shard's real Redis,
    monitors the promoted replica."""
    scripts = render("sentinel").get("ConfigMap", f"{FULLNAME}-sentinel-scripts")["data"]
    script = tmp_path / "start-sentinel.sh"
    script.write_text(scripts["start-sentinel.sh"])
    first, promoted, other = (RedisProcess().start() for _ in range(3))
    try:
        for proc in (first, promoted, other):  # after start: PING then needs no password
            redis.Redis(port=proc.port).config_set("masterauth", "pw")
            redis.Redis(port=proc.port).config_set("requirepass", "pw")
        # The failover the sentinels did before they all went away: the first pod follows
        # the promoted replica, as does the other.
        r_promoted = redis.Redis(port=promoted.port, password="pw")
        for proc in (first, other):
            redis.Redis(port=proc.port, password="pw").replicaof("127.0.0.1", promoted.port)
        for _ in range(500):
            if r_promoted.info("replication")["connected_slaves"] == 2:
                break
            time.sleep(0.02)
        port = free_port()
        hosts = ",".join(f"127.0.0.1:{p.port}" for p in (first, promoted, other))
        env = {
            # The names the scripts run (redis-server, redis-cli), as in the pod's image.
            "PATH": f"{redis_bin}{os.pathsep}{os.environ['PATH']}",
            "SENTINEL_DIR": str(tmp_path),
            "SENTINEL_PORT": str(port),
            "POD_FQDN": "127.0.0.1",
            "SENTINELS": f"127.0.0.1:{free_port()}",  # none answers: all restarted
            "SHARD_NAME": "s",
            "SHARD_COUNT": "1",
            "SHARD_REDIS_HOSTS": hosts,
            "REDIS_PORT": "6379",
            "QUORUM": "1",
            "DOWN_AFTER_MS": "5000",
            "FAILOVER_TIMEOUT_MS": "60000",
            "REDIS_PASSWORD": "pw",
            "REDISCLI_AUTH": "pw",
        }
        with _started(["sh", str(script)], env) as proc:
            sentinel = _answering(port, "pw", proc)
            try:
                _, found = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "s-0")
                assert int(found) == promoted.port
            finally:
                sentinel.close()
        r_promoted.close()
    finally:
        for p in (other, promoted, first):
            p.cleanup()


def test_a_shard_redis_restarted_while_no_sentinel_answers_follows_the_promoted_replica(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Shard 0 failed over (a replica promoted), then the first replica pod restarted while
    every sentinel was away: the chart's start-redis.sh finds the promoted replica among the
    shard's Redis and follows it, not pod i (the primary of its first start)."""
    r = render("sentinel")
    scripts = r.get("ConfigMap", f"{FULLNAME}-sentinel-scripts")["data"]
    (tmp_path / "start-redis.sh").write_text(scripts["start-redis.sh"])
    c = container(r.get("StatefulSet", f"{FULLNAME}-shard")["spec"]["template"]["spec"], "redis")
    promoted, other = RedisProcess().start(), RedisProcess().start()
    try:
        for proc in (promoted, other):
            with redis.Redis(port=proc.port) as r_proc:
                r_proc.config_set("requirepass", "pw")
        # The failover the sentinels did before they went away: the other replica follows.
        with redis.Redis(port=other.port, password="pw") as r_other:
            r_other.config_set("masterauth", "pw")
            r_other.replicaof("127.0.0.1", promoted.port)
        port = free_port()
        env = {
            "PATH": f"{redis_bin}{os.pathsep}{os.environ['PATH']}",
            "TMPDIR": str(tmp_path),
            "REDIS_PASSWORD": "pw",
            "REDISCLI_AUTH": "pw",
            "SENTINELS": f"127.0.0.1:{free_port()}",  # none answers: all away
            "SHARD_MASTER": "s-0",
            "SHARD_INDEX": "0",
            # pod i (down), the promoted replica, the other replica; this pod is not up yet.
            "SHARD_REDIS_HOSTS": f"127.0.0.1:{free_port()},127.0.0.1:{promoted.port},"
            f"127.0.0.1:{other.port}",
            "POD_FQDN": "replica-0.invalid",
            "REDIS_PORT": str(port),
            "KEY_PREFIX": "shardq",
            "WHOLE_SHARD_WAIT_S": "60",
        }
        with _started(_redis_command(c, tmp_path, port), env) as proc:
            client = _answering(port, "pw", proc)
            try:
                info = client.info("replication")
                assert (info["role"], info["master_port"]) == ("slave", promoted.port)
            finally:
                client.close()
    finally:
        for p in (other, promoted):
            p.cleanup()


# --- the whole shard down at once -----------------------------------------------------------------


def _pod_data(
    data_dir: Path, waitmark: int | None, fence: int | None, key: str, bulk_mb: int = 0
) -> None:
    """A shard Redis's AOF as a pod's volume holds it after the shard went down: its marks (the
    waitmark, INCRed before every WAIT for a replica, and the fencing counter), one key only it
    holds, and ``bulk_mb`` MB of other keys in its base file."""
    proc = RedisProcess(data_dir=data_dir).start()
    try:
        with redis.Redis(port=proc.port) as r:
            if waitmark is not None:
                r.set("shardq:waitmark", waitmark)
            if fence is not None:
                r.set("shardq:fence", fence)
            r.set(key, "1")
            for n in range(bulk_mb * 10):  # (random: the base file does not compress it)
                r.set(f"bulk-{n}", os.urandom(100_000))
            if bulk_mb:
                r.bgrewriteaof()
                for _ in range(500):
                    if not r.info("persistence")["aof_rewrite_in_progress"]:
                        break
                    time.sleep(0.02)
    finally:
        proc.stop()  # SIGTERM: redis-server flushes its AOF


Marks = list[tuple[int | None, int | None]]


@dataclasses.dataclass
class _Shard:
    """Shard 0's Redis pods and a sentinel run here as the chart runs them (start-redis.sh and
    start-sentinel.sh, rendered by the real helm), each pod with its own port, AOF directory
    (``only-<k>`` and the marks given, when given) and /tmp, where the script writes the config
    file that a sentinel's CONFIG REWRITE rewrites. Every process ends with the test."""

    stack: contextlib.ExitStack
    tmp: Path
    redis_bin: Path
    container: Doc
    ports: list[int]
    dirs: list[Path]
    #: The pods' WHOLE_SHARD_WAIT_S.
    wait_s: int = 600
    #: The pods' SENTINELS: by default a port nobody listens on (every sentinel away).
    sentinels: str = ""
    procs: dict[int, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    clients: dict[int, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls, render: Render, stack: contextlib.ExitStack, tmp: Path, redis_bin: Path, marks: Marks
    ) -> _Shard:
        r = render("sentinel")
        scripts = r.get("ConfigMap", f"{FULLNAME}-sentinel-scripts")["data"]
        for name in ("start-redis.sh", "start-sentinel.sh"):
            (tmp / name).write_text(scripts[name])
        spec = r.get("StatefulSet", f"{FULLNAME}-shard")["spec"]["template"]["spec"]
        dirs = [tmp / f"pod-{k}" for k in range(len(marks))]
        for k, (w, f) in enumerate(marks):
            _pod_data(dirs[k], w, f, f"only-{k}")
        ports = [free_port() for _ in marks]
        return cls(stack, tmp, redis_bin, container(spec, "redis"), ports, dirs)

    def start(
        self, k: int, *extra_args: str, wait: bool = True, bin_dir: Path | None = None
    ) -> Any:
        """Pod k's Redis, started (with ``extra_args`` after the chart's, and the programs in
        ``bin_dir`` before the others); its client once it answers (``wait``; else see
        :meth:`answering`)."""
        port = self.ports[k]
        own_tmp = self.tmp / f"tmp-{port}"
        own_tmp.mkdir(exist_ok=True)
        path = os.pathsep.join(str(d) for d in (bin_dir, self.redis_bin) if d)
        env = {
            "PATH": f"{path}{os.pathsep}{os.environ['PATH']}",
            "TMPDIR": str(own_tmp),
            "REDIS_PASSWORD": "pw",
            "REDISCLI_AUTH": "pw",
            "SENTINELS": self.sentinels or f"127.0.0.1:{free_port()}",
            "SHARD_MASTER": "s-0",
            "SHARD_INDEX": "0",
            "SHARD_REDIS_HOSTS": ",".join(f"127.0.0.1:{h}" for h in self.ports),  # pod i first
            "POD_FQDN": "127.0.0.1",
            "REDIS_PORT": str(port),
            "KEY_PREFIX": "shardq",
            "WHOLE_SHARD_WAIT_S": str(self.wait_s),
        }
        # (Redis's 5 s wait before a diskless full sync, which the chart keeps, only makes each
        # test wait for its replicas: off here.)
        fast_sync = ("--repl-diskless-sync-delay", "0")
        argv = [
            *_redis_command(self.container, self.tmp, port, self.dirs[k]),
            *fast_sync,
            *extra_args,
        ]
        self.procs[k] = self.stack.enter_context(_started(argv, env))
        return self.answering(k) if wait else None

    def answering(self, k: int) -> Any:
        """Pod k's client, once its Redis answers."""
        self.clients[k] = self.stack.enter_context(_answering(self.ports[k], "pw", self.procs[k]))
        return self.clients[k]

    def start_sentinel(self, down_after_ms: int) -> Callable[[], Any]:
        """A sentinel monitoring the shard (no other one answers it), which the pods started
        from now on ask; a function that returns its client once it listens."""
        port = free_port()
        env = {
            "PATH": f"{self.redis_bin}{os.pathsep}{os.environ['PATH']}",
            "SENTINEL_DIR": str(self.tmp),
            "SENTINEL_PORT": str(port),
            "POD_FQDN": "127.0.0.1",
            "SENTINELS": f"127.0.0.1:{free_port()}",
            "SHARD_NAME": "s",
            "SHARD_COUNT": "1",
            "SHARD_REDIS_HOSTS": ",".join(f"127.0.0.1:{p}" for p in self.ports),
            "REDIS_PORT": "6379",
            "QUORUM": "1",
            "DOWN_AFTER_MS": str(down_after_ms),
            "FAILOVER_TIMEOUT_MS": "60000",
            "REDIS_PASSWORD": "pw",
            "REDISCLI_AUTH": "pw",
        }
        self.sentinels = f"127.0.0.1:{port}"
        argv = ["sh", str(self.tmp / "start-sentinel.sh")]
        self.procs[-1] = self.stack.enter_context(_started(argv, env))
        return lambda: self.stack.enter_context(_answering(port, "pw", self.procs[-1]))

    def settled(self, primary: int) -> list[dict[str, Any]]:
        """Until pod ``primary`` is a primary with every other pod started replicating from it,
        in sync; their INFO replication then, in pod order."""
        pods = sorted(self.clients)
        infos: list[dict[str, Any]] = []
        for _ in range(1500):
            for proc in self.procs.values():
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            infos = [self.clients[k].info("replication") for k in pods]
            if infos[pods.index(primary)]["role"] == "master" and all(
                info["role"] == "slave"
                and info["master_port"] == self.ports[primary]
                and info["master_link_status"] == "up"
                for k, info in zip(pods, infos, strict=True)
                if k != primary
            ):
                return infos
            time.sleep(0.02)
        raise AssertionError(f"no settled shard with pod {primary} primary: {infos}")

    def keys(self, pattern: str) -> list[set[str]]:
        """The keys matching ``pattern`` on each pod started, in pod order."""
        return [{k.decode() for k in self.clients[p].keys(pattern)} for p in sorted(self.clients)]

    def stop(self) -> None:
        """SIGTERM to every process at once: one by one, a primary would wait for replicas still
        up (shutdown-timeout, 10 s)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()


@pytest.mark.parametrize(
    ("marks", "winner"),
    [
        # The most acknowledged writes win, though pod i has more claims.
        ([(5, 9), (7, 3), (6, 8)], 1),
        # Waitmarks equal (or no replica ever waited for): the fencing counter decides.
        ([(None, 4), (None, 4), (None, 6)], 2),
        ([(3, 4), (3, 5), (3, 5)], 1),
        # A first start (no data anywhere): pod i, the first in pod order.
        ([(None, None), (None, None), (None, None)], 0),
    ],
)
def test_a_shard_down_all_at_once_comes_back_with_the_redis_that_holds_the_most_writes(
    render: Render, tmp_path: Path, redis_bin: Path, marks: Marks, winner: int
) -> None:
    """Every Redis of shard 0 and every sentinel went down at once. Each pod's start-redis.sh,
    run against its own AOF, waits (a replica of nobody) until all of the shard's Redis are up,
    then they elect the one with the highest waitmark, then fence, then pod order: it becomes
    the primary, with its data, and the others replicate from it (dropping what only they had,
    which no replica acknowledged)."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, marks)
        for k in range(len(marks)):
            shard.start(k)
        infos = shard.settled(winner)
        assert infos[winner]["connected_slaves"] == len(marks) - 1
        # The winner's data everywhere; no one else's.
        assert shard.keys("only-*") == [{f"only-{winner}"}] * len(marks)
        shard.stop()


def test_the_shard_waits_for_a_late_redis_that_holds_more_writes(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Pod 2, the one holding the most acknowledged writes, comes up last: pods 0 and 1, up
    and waiting, do not elect one of themselves before it answers (within
    WHOLE_SHARD_WAIT_S), so its writes are kept."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(1, 1), (2, 0), (9, 9)])
        for k in (0, 1):
            client = shard.start(k)
            for _ in range(500):
                if client.info("persistence")["loading"] == 0:
                    break
                time.sleep(0.02)
            assert client.info("replication")["master_host"] == "electing.shardq.invalid"
        time.sleep(3)  # a few rounds of the election (one a second) without pod 2
        assert [shard.clients[k].info("replication")["role"] for k in (0, 1)] == ["slave"] * 2
        shard.start(2)
        shard.settled(2)
        assert shard.keys("only-*") == [{"only-2"}] * 3
        shard.stop()


def test_a_pod_that_never_comes_back_is_waited_for_only_so_long(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Pod 2's node is gone: after WHOLE_SHARD_WAIT_S, the pods that are up elect among
    themselves; when pod 2 comes back later, it follows their primary, though its own marks
    were higher (what it alone held, no replica had acknowledged: the others would have it)."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(1, 1), (2, 0), (9, 9)])
        shard.wait_s = 5  # pods 0 and 1 are both up well within it
        for k in (0, 1):
            shard.start(k)
        shard.settled(1)
        shard.start(2)
        shard.settled(1)
        assert shard.keys("only-*") == [{"only-1"}] * 3
        shard.stop()


def test_a_redis_still_loading_its_aof_is_waited_for_past_the_wait(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Pod 1 holds the most writes and a large AOF, which it takes longer than
    WHOLE_SHARD_WAIT_S to load (a slow disk, here a delay per key): it answers LOADING
    meanwhile, and pod 0, loaded long before, waits for it instead of taking the shard."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(1, 1), (None, None)])
        _pod_data(shard.dirs[1], 2, 0, "only-1", bulk_mb=4)
        shard.wait_s = 1
        # 0.1 s a key (4 s for its 40), answering between any two.
        slow = ("--key-load-delay", "100000", "--loading-process-events-interval-bytes", "65536")
        shard.start(1, *slow, wait=False)
        # Pod 0 starts once pod 1 answers (loading): the wait is for a pod that does not
        # answer at all, which a pod 1 slower to start than the wait (a busy machine) would be.
        client: Any = redis.Redis(port=shard.ports[1], password="pw", socket_timeout=2)
        stack.callback(client.close)
        for _ in range(500):
            assert shard.procs[1].poll() is None
            with contextlib.suppress(redis.ConnectionError):
                assert client.info("persistence")["loading"] == 1
                break
            time.sleep(0.02)
        else:
            raise AssertionError("pod 1 never answered")
        shard.start(0, wait=False)
        for k in (0, 1):
            shard.answering(k)
        shard.settled(1)
        assert shard.keys("only-*") == [{"only-1"}] * 2
        shard.stop()


def _cli_wrapper(folder: Path, redis_bin: Path, cases: str) -> Path:
    """``folder`` with a redis-cli that runs the shell ``cases`` (patterns on its arguments,
    ``$real`` the real redis-cli) before it runs the real one."""
    folder.mkdir()
    cli = folder / "redis-cli"
    cli.write_text(
        f'#!/bin/sh\nreal="{redis_bin / "redis-cli"}"\ncase " $* " in\n{cases}\nesac\n'
        'exec "$real" "$@"\n'
    )
    cli.chmod(0o755)
    return folder


def test_a_redis_that_wins_while_a_pod_reads_the_marks_is_followed_not_doubled(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """Pod 1 (the most writes) becomes the primary between pod 0's discover, which found no
    primary, and pod 0's reading of pod 1's marks, which then finds it one. Their redis-cli
    hold the order: pod 1 sees pod 0's marks only once pod 0 has run the election's discover
    on it, and pod 0 gets pod 1's marks only once pod 1 is primary. Pod 0, past its
    WHOLE_SHARD_WAIT_S of 0, follows pod 1: it does not take pod 1 for a Redis that does not
    answer and elect itself as well (two primaries)."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(1, 1), (2, 0)])
        p0, p1 = shard.ports
        discovered, once = tmp_path / "discovered", tmp_path / "discovered-once"
        not_before = f"""  *" -p {p0} "*persistence*) [ -e "{discovered}" ] || exit 1 ;;"""
        pod_1_bin = _cli_wrapper(tmp_path / "bin-1", redis_bin, not_before)
        shard.start(1, bin_dir=pod_1_bin)  # waits for pod 0 however long (wait_s 600)
        after_discover = f"""  *" -p {p1} "*persistence*)
    n=0
    until "$real" -p {p1} --no-auth-warning INFO replication | grep -q role:master; do
      n=$((n + 1)); [ "$n" -gt 300 ] && break; sleep 0.1
    done ;;
  *" -p {p1} "*replication*)  # the first discover is the one before its Redis starts
    [ -e "{once}" ] && touch "{discovered}"
    touch "{once}" ;;"""
        shard.wait_s = 0
        shard.start(0, bin_dir=_cli_wrapper(tmp_path / "bin-0", redis_bin, after_discover))
        shard.settled(1)
        assert discovered.exists()
        assert shard.keys("only-*") == [{"only-1"}] * 2
        shard.stop()


def test_sentinels_started_while_the_shard_elects_monitor_the_winner_not_pod_i(
    render: Render, tmp_path: Path, redis_bin: Path
) -> None:
    """The sentinel comes up before the shard's Redis have elected their primary (none is up
    yet): it names no primary until the election, then the winner. Monitoring pod i meanwhile,
    it would watch a replica, which it would never leave."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(1, 1), (2, 0)])
        sentinel = shard.start_sentinel(down_after_ms=5000)()
        assert sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "s-0") is None
        for k in (0, 1):
            shard.start(k)
        shard.settled(1)
        for _ in range(500):
            if found := sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "s-0"):
                break
            time.sleep(0.02)
        assert found and int(found[1]) == shard.ports[1], found
        for _ in range(1500):  # it watches the shard: it learns the replica from the winner
            if sentinel.execute_command("SENTINEL", "REPLICAS", "s-0"):
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the sentinel never learnt the replica")
        shard.stop()


# --- a primary restarted in place -----------------------------------------------------------------


@pytest.mark.parametrize("replica_ahead", [True, False])
def test_a_primary_restarted_in_place_takes_the_shard_back_only_if_no_replica_is_ahead(
    render: Render, tmp_path: Path, redis_bin: Path, replica_ahead: bool
) -> None:
    """Pod 0, the primary, is killed (-9) and restarts before the sentinels fail over, so they
    still name it. When its AOF lacks writes a replica acknowledged (the last second of
    appendfsync everysec, made here by writing the replica's waitmark past it), it does not
    take the shard back, which would make the replica drop them: it has the sentinels promote
    the replica now and follows it. When no replica is ahead, it is the primary again."""
    with contextlib.ExitStack() as stack:
        shard = _Shard.of(render, stack, tmp_path, redis_bin, [(None, None), (None, None)])
        # A first start: pod 0 primary, pod 1 its replica, a sentinel watching them (that
        # never fails over on its own within the test).
        primary, replica = shard.start(0), shard.start(1)
        shard.settled(0)
        sentinel = shard.start_sentinel(down_after_ms=600_000)()
        for _ in range(1500):  # until it has learnt the replica from the primary
            if sentinel.execute_command("SENTINEL", "REPLICAS", "s-0"):
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the sentinel never learnt the replica")
        primary.set("shardq:waitmark", 5)
        for _ in range(500):
            if replica.get("shardq:waitmark") == b"5":
                break
            time.sleep(0.02)
        if replica_ahead:  # what pod 0's AOF lost: on the replica only
            replica.config_set("replica-read-only", "no")
            replica.set("shardq:waitmark", 6)
        os.killpg(shard.procs[0].pid, signal.SIGKILL)
        shard.procs[0].wait(10)
        shard.start(0)
        shard.settled(1 if replica_ahead else 0)
        want = b"6" if replica_ahead else b"5"
        assert [shard.clients[k].get("shardq:waitmark") for k in (0, 1)] == [want, want]
        # The sentinel names the promoted replica once it has seen it promoted (it checks
        # every second during a failover), which may be after the pods settled.
        want_port = shard.ports[1 if replica_ahead else 0]
        for _ in range(500):
            _, port = sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "s-0")
            if int(port) == want_port:
                break
            time.sleep(0.02)
        assert int(port) == want_port
        shard.stop()
