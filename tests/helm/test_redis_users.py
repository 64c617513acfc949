"""shards.redis.aclUsers as the chart deploys it: each process logs in as its role's Redis ACL
user (``shardq shards acl``), whose password only that process's pods get; every Redis of a
shard, replicas included, starts with those users from a file an init container writes with
``shardq shards acl-conf`` (tests/integration/test_redis_acl.py starts a real Redis on such a
file). Off, nothing changes."""

from __future__ import annotations

from collections.abc import Callable

from tests.helm.conftest import Doc, Rendered
from tests.helm.test_chart import FULLNAME, container, env_of, worker_deployments

Render = Callable[[str], Rendered]
GENERATED = f"{FULLNAME}-redis-users"


def login(c: Doc) -> tuple[str, str, str]:
    """(username, Secret, key) a container logs in to the shards with."""
    env = env_of(c)
    ref = env["SHARDQ_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    return env["SHARDQ_REDIS_USERNAME"]["value"], ref["name"], ref["key"]


def redis_pods(r: Rendered) -> list[Doc]:
    """The pod specs of every StatefulSet with a redis container (shards and replicas)."""
    specs = [s["spec"]["template"]["spec"] for s in r.kind("StatefulSet")]
    return [p for p in specs if any(c["name"] == "redis" for c in p["containers"])]


def test_each_process_logs_in_as_its_roles_user(render: Render) -> None:
    r = render("redis-users")
    coordinator = r.get("Deployment", f"{FULLNAME}-coordinator")["spec"]["template"]["spec"]
    assert login(container(coordinator, "coordinator")) == (
        "sq-coordinator",
        GENERATED,
        "coordinator",
    )
    shard = r.get("StatefulSet", f"{FULLNAME}-shard")["spec"]["template"]["spec"]
    assert login(container(shard, "shard")) == ("sq-loop", GENERATED, "loop")
    (worker,) = worker_deployments(r)
    pod = worker["spec"]["template"]["spec"]
    assert login(container(pod, "worker")) == ("sq-worker", GENERATED, "worker")
    # The default user's password (probes, replication, hooks) reaches no worker.
    default_secret = f"{FULLNAME}-redis"
    for c in pod["containers"] + pod.get("initContainers", []):
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            assert ref.get("name") != default_secret, (c["name"], e["name"])
    secret = r.get("Secret", GENERATED)
    assert sorted(secret["data"]) == ["coordinator", "loop", "worker"]


def test_every_redis_of_a_shard_starts_with_the_users(render: Render) -> None:
    for values, secret in (("redis-users", GENERATED), ("redis-users-sentinel", "my-redis-users")):
        r = render(values)
        pods = redis_pods(r)
        assert len(pods) == (1 if values == "redis-users" else 3), values  # + 2 replica sets
        for pod in pods:
            (init,) = [c for c in pod["initContainers"] if c["name"] == "redis-users"]
            assert "shardq shards acl-conf > /redis-users/users.conf" in init["command"][-1]
            env = env_of(init)
            for role in ("worker", "loop", "coordinator"):
                ref = env[f"SHARDQ_REDIS_PASSWORD_{role.upper()}"]["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) == (secret, role)
            redis = container(pod, "redis")
            mounts = {m["name"]: m["mountPath"] for m in redis["volumeMounts"]}
            assert mounts["redis-users"] == "/redis-users"
            assert {"name": "redis-users", "emptyDir": {}} in pod["volumes"]
        start = "\n".join(
            str(c.get("command")) + str(c.get("args"))
            for p in pods
            for c in p["containers"]
            if c["name"] == "redis"
        ) + "".join(str(m["data"]) for m in r.kind("ConfigMap"))
        assert "include /redis-users/users.conf" in start, values
        assert not any(s["metadata"]["name"] == GENERATED for s in r.kind("Secret")) or (
            secret == GENERATED
        )


def test_without_acl_users_every_process_uses_the_default_password(render: Render) -> None:
    r = render("default")
    text = str(r.docs)
    assert "redis-users" not in text and "SHARDQ_REDIS_USERNAME" not in text
