"""The hooks that grow the cluster: `shards-sync` records the tenant moves a new shard count
causes, the `moves` Job after it runs them, and both first wait until every shard answers.

Raising `shards.count` runs these after the StatefulSet is updated, when the new shard pods
may still be starting; the moves Job has its own time limit, and the mover's wait for running
jobs comes from values.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType

import pytest
import redis

from shardq.coordinator import cli
from shardq.coordinator.tools.redis_server import RedisProcess, free_port
from tests.helm.conftest import VALUES_FILES, Doc, Rendered, run_helm, template_args
from tests.helm.test_chart import (
    FULLNAME,
    container,
    env_of,
    hook_phases,
    hook_weight,
    values_of,
)

Render = Callable[[str], Rendered]


def pod_spec(job: Doc) -> Doc:
    spec: Doc = job["spec"]["template"]["spec"]
    return spec


def shard_addresses(r: Rendered) -> list[str]:
    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    cmd = container(pod_spec(sync), "shards-sync")["command"]
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--address"]


def pinged_pod(address: str) -> str:
    """The shard pod a wait pings for ``address``: its host's pod name; for a Sentinel group
    (``sentinel://s0,s1,s2/<shard-pod>``) the pod first started as that shard's primary (a
    wait on the data pod itself, which answers PING as primary or replica)."""
    if address.startswith("sentinel://"):
        return address.rsplit("/", 1)[1]
    return address.split(".", 1)[0]


def redis_password_ref(r: Rendered) -> Doc:
    """Where the shards' Redis reads its password: every client must read the same one."""
    sts = r.get("StatefulSet", f"{FULLNAME}-shard")
    ref: Doc = env_of(container(pod_spec(sts), "redis"))["REDIS_PASSWORD"]["valueFrom"]
    return ref


@pytest.mark.parametrize("name", VALUES_FILES)
def test_sync_records_the_moves_and_the_moves_hook_runs_them(
    render: Render, yaml_mod: ModuleType, name: str
) -> None:
    r = render(name)
    values = values_of(name, yaml_mod)
    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    moves = r.get("Job", f"{FULLNAME}-moves")

    # The sync asks nothing (no terminal in a Job) and leaves the moves to the next Job.
    sync_cmd = container(pod_spec(sync), "shards-sync")["command"]
    sync_args = cli.build_parser().parse_args(sync_cmd[1:])
    assert sync_args.yes and sync_args.no_move

    # After the sync, in the same phases: helm runs a weight only once the lower ones succeeded.
    assert hook_phases(moves) == hook_phases(sync) == {"post-install", "post-upgrade"}
    assert hook_weight(moves) > hook_weight(sync)
    migrate = r.get("Job", f"{FULLNAME}-migrate")
    assert hook_weight(migrate) < hook_weight(sync)

    c = container(pod_spec(moves), "moves")
    assert c["command"][:3] == ["shardq", "moves", "run"]
    args = cli.build_parser().parse_args(c["command"][1:])
    assert args.tenant_id == [], "the hook runs every move in progress"
    hooks = values["hooks"]
    assert args.active_wait_s == hooks["moves"]["activeWaitSeconds"]
    assert moves["spec"]["activeDeadlineSeconds"] == hooks["moves"]["activeDeadlineSeconds"]
    assert moves["spec"]["activeDeadlineSeconds"] > args.active_wait_s
    assert moves["spec"]["backoffLimit"] == hooks["backoffLimit"]
    assert c["image"] == container(pod_spec(sync), "shards-sync")["image"]

    # Same database, Redis password and key prefix as the sync (and the shards themselves).
    env = env_of(c)
    sync_env = env_of(container(pod_spec(sync), "shards-sync"))
    for var in ("SHARDQ_DATABASE_URL", "SHARDQ_DB_PASSWORD", "SHARDQ_REDIS_PASSWORD"):
        assert env.get(var) == sync_env.get(var), var
    assert "SHARDQ_DATABASE_URL" in env
    assert env["SHARDQ_REDIS_PASSWORD"]["valueFrom"] == redis_password_ref(r)
    assert env["SHARDQ_KEY_PREFIX"]["value"] == values["keyPrefix"]


def test_the_time_budget_comes_from_values(render: Render) -> None:
    r = render("slow-moves")
    moves = r.get("Job", f"{FULLNAME}-moves")
    c = container(pod_spec(moves), "moves")
    assert c["command"] == ["shardq", "moves", "run", "--active-wait-s", "1800"]
    assert moves["spec"]["activeDeadlineSeconds"] == 3600
    env = env_of(c)
    assert env["SHARDQ_KEY_PREFIX"]["value"] == "jobs-prod"
    assert env["SHARDQ_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "redis-creds",
        "key": "pw",
    }
    # The sync keeps the chart-wide limit: it only changes the map.
    assert r.get("Job", f"{FULLNAME}-shards-sync")["spec"]["activeDeadlineSeconds"] == 280


@pytest.mark.parametrize("name", VALUES_FILES)
def test_both_hooks_wait_for_every_shard_first(render: Render, name: str) -> None:
    r = render(name)
    addresses = shard_addresses(r)
    for job_name in ("shards-sync", "moves"):
        job = r.get("Job", f"{FULLNAME}-{job_name}")
        (wait,) = pod_spec(job)["initContainers"]
        assert wait["name"] == "wait-for-shards"
        assert wait["command"][:2] == ["python", "-c"]
        compile(wait["command"][2], "wait-for-shards", "exec")
        assert [pinged_pod(a) for a in wait["command"][3:]] == [pinged_pod(a) for a in addresses], (
            job_name
        )
        assert env_of(wait)["SHARDQ_REDIS_PASSWORD"]["valueFrom"] == redis_password_ref(r)


def test_moves_hook_can_be_left_to_the_operator(helm: str, yaml_mod: ModuleType) -> None:
    sets = ["--set", "hooks.moves.enabled=false", "--set", "networkPolicy.enabled=true"]
    proc = run_helm(helm, *template_args([], sets))
    assert proc.returncode == 0, proc.stderr
    r = Rendered("moves-off", [d for d in yaml_mod.safe_load_all(proc.stdout) if d])
    assert ("Job", f"{FULLNAME}-moves") not in r.by_key
    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    sync_args = cli.build_parser().parse_args(
        container(pod_spec(sync), "shards-sync")["command"][1:]
    )
    assert sync_args.no_move, "the sync must not run moves the operator means to run"
    rules = r.get("NetworkPolicy", f"{FULLNAME}-shard")["spec"]["ingress"]
    components = {
        peer["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
        for rule in rules
        for peer in rule.get("from", [])
        if "podSelector" in peer  # not the metrics rule's monitoring namespace
    }
    assert "moves" not in components
    assert "shards-sync" in components


# --------------------------------------------------------------------------- the wait script


def wait_script(render: Render) -> str:
    job = render("default").get("Job", f"{FULLNAME}-shards-sync")
    script: str = pod_spec(job)["initContainers"][0]["command"][2]
    return script


def test_wait_script_returns_once_the_shard_answers_with_the_password(render: Render) -> None:
    """Run the rendered script: it waits while nothing listens and while the password is
    refused, and returns as soon as the shard answers PING."""
    port = free_port()
    env = {**os.environ, "SHARDQ_REDIS_PASSWORD": "s3cret"}
    proc = subprocess.Popen(
        [sys.executable, "-c", wait_script(render), f"127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = RedisProcess(port=port)
    try:
        time.sleep(2.5)
        assert proc.poll() is None, "returned while no shard listened"
        server.start()  # no password yet: AUTH is refused
        time.sleep(2.5)
        assert proc.poll() is None, "returned while the password was refused"
        redis.Redis(port=port).config_set("requirepass", "s3cret")
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
        server.cleanup()
    assert proc.returncode == 0, out
    assert f"waiting for shard 127.0.0.1:{port}" in out
    assert out.rstrip().endswith(f"shard 127.0.0.1:{port} is up")
