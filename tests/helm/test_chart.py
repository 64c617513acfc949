"""The chart, rendered by the real helm with its defaults and with every file under values/.

Checks what matters for running shardq: the manifests are valid Kubernetes objects, the shard
count and the shard addresses agree, every container is bounded, probed and non-root, no
Secret carries a default password, the schema is migrated before anything needs it, and a
worker is given its whole drain grace.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.helm.conftest import (
    CHART,
    NAMESPACE,
    VALUES_DIR,
    VALUES_FILES,
    Doc,
    Rendered,
    run_helm,
    template_args,
)

Render = Callable[[str], Rendered]

# The chart's floor (Chart.yaml kubeVersion) and the newest schemas kubernetes-validate bundles.
K8S_FLOOR = "1.28.0"
# Kinds from CRDs, which kubernetes-validate has no schema for; checked by hand below.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "Job"}
FULLNAME = "demo-shardq"


def values_of(name: str, yaml_mod: ModuleType) -> dict[str, Any]:
    """The chart's defaults with the named file's values merged over them."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    base: dict[str, Any] = yaml_mod.safe_load((CHART / "values.yaml").read_text())
    if name == "default":
        return base
    return merge(base, yaml_mod.safe_load((VALUES_DIR / f"{name}.yaml").read_text()))


def pod_specs(r: Rendered) -> Iterator[tuple[Doc, Doc]]:
    for doc in r.docs:
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc, doc["spec"]["template"]["spec"]


def env_of(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def container(spec: Doc, name: str) -> Doc:
    matches = [c for c in spec["containers"] if c["name"] == name]
    assert matches, f"no container {name} in {[c['name'] for c in spec['containers']]}"
    found: Doc = matches[0]
    return found


def hook_phases(doc: Doc) -> set[str]:
    return set(doc["metadata"]["annotations"]["helm.sh/hook"].split(","))


def hook_weight(doc: Doc) -> int:
    return int(doc["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))


def worker_deployments(r: Rendered) -> list[Doc]:
    return [
        d
        for d in r.kind("Deployment")
        if d["spec"]["template"]["metadata"]["labels"].get("shardq.io/role") == "worker"
    ]


# --------------------------------------------------------------------------- lint and schema


@pytest.mark.parametrize("name", VALUES_FILES)
def test_helm_lint_strict(helm: str, name: str) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if name != "default":
        args += ["--values", str(VALUES_DIR / f"{name}.yaml")]
    proc = run_helm(helm, *args)
    assert proc.returncode == 0, f"helm lint --strict ({name}):\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("name", VALUES_FILES)
def test_manifests_pass_kubernetes_validate_strict(
    render: Render, kubernetes_validate: ModuleType, name: str
) -> None:
    latest = kubernetes_validate.utils.latest_version()
    r = render(name)
    assert r.docs, f"{name}: nothing rendered"
    validated: set[str] = set()
    for doc in r.docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in (K8S_FLOOR, latest):
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                what = f"{doc['kind']}/{doc['metadata']['name']}"
                pytest.fail(f"{name}: {what} (k8s {version}): {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                pytest.fail(f"{name}: {e.message}")
        validated.add(doc["kind"])
    assert validated >= {"Deployment", "StatefulSet", "Service", "Job", "PodDisruptionBudget"}


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_ops_endpoint_in_the_chart_listens_on_the_pod_address(
    render: Render, name: str
) -> None:
    """The programs bind /metrics, /healthz and /readyz to loopback by default (a laptop's
    cluster is not the network's); in a pod, kubelet and Prometheus come from outside the
    container, so every container that has an ops port says 0.0.0.0."""
    r = render(name)
    seen = 0
    for doc in r.docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []):
            env = env_of(c)
            if "SHARDQ_METRICS_PORT" in env:
                seen += 1
                assert env["SHARDQ_METRICS_HOST"]["value"] == "0.0.0.0", c["name"]
    assert seen >= 2  # the coordinator and a shard loop at least (worker groups where set)


def test_crd_monitors_point_at_metrics_ports(render: Render) -> None:
    r = render("everything")
    monitors = r.kind("ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {
        f"{FULLNAME}-coordinator",
        f"{FULLNAME}-shard",
    }
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "prometheus"
        svc = r.get("Service", m["metadata"]["name"])
        assert m["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert "metrics" in {p["name"] for p in svc["spec"]["ports"]}
        assert [e["port"] for e in m["spec"]["endpoints"]] == ["metrics"]
    (pod_monitor,) = r.kind("PodMonitor")
    for d in worker_deployments(r):
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_every_value_is_documented_and_typed(yaml_mod: ModuleType) -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml_mod.safe_load(text)
    params = set(re.findall(r"^\s*## @param (\S+) \S", text, re.M))
    sections = re.findall(r"^## @section (.+)$", text, re.M)
    schema = json.loads((CHART / "values.schema.json").read_text())

    def leaves(v: Any, path: str) -> Iterator[str]:
        # A documented object (e.g. resources, securityContext) counts as one value.
        if isinstance(v, dict) and v and path not in params:
            for k, sub in v.items():
                yield from leaves(sub, f"{path}.{k}" if path else k)
        else:
            yield path

    undocumented = sorted(set(leaves(values, "")) - params)
    assert not undocumented, f"values without ## @param: {undocumented}"
    assert len(sections) >= 8

    def node(path: str) -> Doc:
        n: Doc = schema
        for part in path.split("."):
            n = n["properties"][part]
        return n

    for p in sorted(params):
        n = node(p)
        assert n.get("description"), f"schema: {p} has no description"
        kinds = n.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        assert set(kinds) <= {"string", "integer", "number", "boolean", "object", "array"}, p
    for p in (
        "logLevel",
        "image.pullPolicy",
        "coordinator.service.type",
        "shards.redis.appendfsync",
    ):
        assert node(p).get("enum"), f"schema: {p} has no enum"
    assert node("shards.count")["minimum"] == 1


def test_no_password_has_a_default(yaml_mod: ModuleType) -> None:
    text = (CHART / "values.yaml").read_text()

    def secrets_in(v: Any, path: str) -> Iterator[str]:
        if isinstance(v, dict):
            for k, sub in v.items():
                yield from secrets_in(sub, f"{path}.{k}")
        # Not the key of a credential in a Secret, nor a duration (tokenCache.ttlSeconds).
        elif (
            re.search(r"password|token|url$", path, re.I)
            and not path.endswith(("Key", "Seconds"))
            and v
        ):
            yield f"{path}={v!r}"

    assert not list(secrets_in(yaml_mod.safe_load(text), "")), "a credential has a default"


# --------------------------------------------------------------------------- shards


@pytest.mark.parametrize("name", VALUES_FILES)
def test_shard_count_and_addresses_agree(render: Render, yaml_mod: ModuleType, name: str) -> None:
    r = render(name)
    values = values_of(name, yaml_mod)
    count = values["shards"]["count"]
    sts = r.get("StatefulSet", f"{FULLNAME}-shard")
    assert sts["spec"]["replicas"] == count

    # The headless Service gives pod i the address the shard map is given for shard i.
    svc = r.get("Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    (redis_port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "redis"]
    expected = [
        f"{sts['metadata']['name']}-{i}.{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{redis_port}"
        for i in range(count)
    ]
    sentinel = values["shards"]["sentinel"]
    if sentinel["enabled"]:  # the map names each shard by its Sentinel group
        expected = [f"{sentinel_group(r)}/{sts['metadata']['name']}-{i}" for i in range(count)]

    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    cmd = container(sync["spec"]["template"]["spec"], "shards-sync")["command"]
    assert cmd[:3] == ["shardq", "shards", "sync"]
    assert cmd[cmd.index("--shards") + 1] == str(count)
    addresses = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--address"]
    assert addresses == expected

    # Each shard loop learns its id from its pod's ordinal, and talks to the Redis beside it.
    spec = sts["spec"]["template"]["spec"]
    loops = [c for c in spec["containers"] if c["command"] == ["shardq-shard"]]
    assert len(loops) == (2 if values["shards"]["standby"]["enabled"] else 1)
    for c in loops:
        env = env_of(c)
        ref = env["SHARDQ_SHARD_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert ref == "metadata.labels['apps.kubernetes.io/pod-index']"
        url = f"redis://127.0.0.1:{redis_port}/0"
        if sentinel["enabled"]:
            url = f"{sentinel_group(r)}/{sts['metadata']['name']}-$(SHARDQ_SHARD_ID)"
        assert env["SHARDQ_REDIS_URL"]["value"] == url
    ports = {env_of(c)["SHARDQ_METRICS_PORT"]["value"] for c in loops}
    assert len(ports) == len(loops), "the active and standby loops share a metrics port"


def sentinel_group(r: Rendered) -> str:
    """``sentinel://`` and every sentinel pod's host:port (their StatefulSet and Service)."""
    sts = r.get("StatefulSet", f"{FULLNAME}-sentinel")
    svc = r.get("Service", sts["spec"]["serviceName"])
    (port,) = [p["port"] for p in svc["spec"]["ports"] if p["name"] == "sentinel"]
    hosts = [
        f"{sts['metadata']['name']}-{j}.{svc['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}"
        for j in range(sts["spec"]["replicas"])
    ]
    return "sentinel://" + ",".join(hosts)


def test_sentinel_runs_each_shard_as_a_fenced_primary_with_replicas(
    render: Render, yaml_mod: ModuleType
) -> None:
    """shards.sentinel: per shard a replica StatefulSet following pod i, three sentinels that
    monitor every shard, min-replicas-to-write on every Redis, and every shardq program told
    to wait for a replica; off by default."""
    assert not any(d["metadata"]["name"].endswith("-sentinel") for d in render("default").docs)
    r = render("sentinel")
    values = values_of("sentinel", yaml_mod)
    count, sn = values["shards"]["count"], values["shards"]["sentinel"]
    sentinels = r.get("StatefulSet", f"{FULLNAME}-sentinel")
    assert sentinels["spec"]["replicas"] == sn["sentinels"] >= 3
    scripts = r.get("ConfigMap", f"{FULLNAME}-sentinel-scripts")["data"]
    monitor = "sentinel monitor $1 ${2%:*} ${2##*:} $QUORUM"
    assert monitor in scripts["start-sentinel.sh"]
    primary = r.get("StatefulSet", f"{FULLNAME}-shard")
    redis_of = [container(primary["spec"]["template"]["spec"], "redis")]
    for i in range(count):
        replicas = r.get("StatefulSet", f"{FULLNAME}-shard-{i}-replica")
        assert replicas["spec"]["replicas"] == sn["replicas"]
        c = container(replicas["spec"]["template"]["spec"], "redis")
        env = env_of(c)
        assert env["SHARD_INDEX"]["value"] == str(i)
        assert env["WHOLE_SHARD_WAIT_S"]["value"] == str(sn["wholeShardWaitSeconds"])
        # Pod i first among shard i's Redis: the whole shard down, it wins a tie of the election.
        first = env["SHARD_REDIS_HOSTS"]["value"].split(";")[i].split(",")[0]
        assert first.startswith(f"{FULLNAME}-shard-{i}.{FULLNAME}-shard."), first
        assert replicas["spec"]["volumeClaimTemplates"], "a replica keeps its AOF on a volume"
        redis_of.append(c)
    for c in redis_of:
        args = c["args"]
        assert c["command"] == ["sh", "/scripts/start-redis.sh"]
        assert args[args.index("--min-replicas-to-write") + 1] == "1"
        assert args[args.index("--min-replicas-max-lag") + 1] == str(sn["minReplicasMaxLagS"])
        assert args[args.index("--appendonly") + 1] == "yes"
        assert env_of(c)["SENTINELS"]["value"] == sentinel_group(r).removeprefix("sentinel://")
    programs = {
        "coordinator": (r.get("Deployment", f"{FULLNAME}-coordinator"), "coordinator"),
        "shard loop": (primary, "shard"),
        "shards-sync": (r.get("Job", f"{FULLNAME}-shards-sync"), "shards-sync"),
    }
    waits = {
        name: env_of(container(doc["spec"]["template"]["spec"], c))
        .get("SHARDQ_SHARD_REPLICAS_TO_ACK", {})
        .get("value")
        for name, (doc, c) in programs.items()
    }
    assert waits == dict.fromkeys(waits, str(sn["replicasToAck"]))


@pytest.mark.parametrize("name", VALUES_FILES)
def test_shard_loops_reach_the_results_database_as_the_coordinator_does(
    render: Render, name: str
) -> None:
    """A shard loop writes the result rows of jobs that end without a worker (reaped dead,
    cancelled): every loop gets SHARDQ_DATABASE_URL from the same Secret (and composed the same
    way) as the coordinator."""
    r = render(name)
    coordinator = r.get("Deployment", f"{FULLNAME}-coordinator")
    want = env_of(container(coordinator["spec"]["template"]["spec"], "coordinator"))
    sts = r.get("StatefulSet", f"{FULLNAME}-shard")
    loops = [c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] != "redis"]
    assert loops
    for c in loops:
        env = env_of(c)
        if "SHARDQ_DB_ROLE_PASSWORD" in env:
            # databaseRoles: the loop's own role, on the coordinator's database.
            where = env["SHARDQ_DATABASE_URL"]["value"].split("@", 1)[1]
            assert where == want["SHARDQ_DATABASE_URL"]["value"].split("@", 1)[1], name
            assert "secretKeyRef" in env["SHARDQ_DB_ROLE_PASSWORD"]["valueFrom"], name
            continue
        for var in ("SHARDQ_DATABASE_URL", "SHARDQ_DB_PASSWORD"):
            assert env.get(var) == want.get(var), f"{name}: {c['name']}: {var}"
        # From a Secret, or composed by Kubernetes from the bundled Postgres's password Secret.
        url = env["SHARDQ_DATABASE_URL"]
        source = url if "valueFrom" in url else env["SHARDQ_DB_PASSWORD"]
        assert "secretKeyRef" in source["valueFrom"], f"{name}: {c['name']}: not from a Secret"


@pytest.mark.parametrize("name", ["default", "eight-shards"])
def test_redis_is_durable_and_authenticated(render: Render, name: str) -> None:
    r = render(name)
    sts = r.get("StatefulSet", f"{FULLNAME}-shard")
    redis = container(sts["spec"]["template"]["spec"], "redis")
    args = redis["args"]
    flags = dict(zip(args[::2], args[1::2], strict=False))
    assert flags["--appendonly"] == "yes"
    assert flags["--maxmemory-policy"] == "noeviction"
    # The password from the Secret, written to a config file at start (not on the command
    # line: tests/helm/test_sentinel_mode.py runs it).
    assert "--requirepass" not in flags
    assert 'exec redis-server "$REDIS_AUTH_CONF" "$@"' in redis["command"][2]
    assert "secretKeyRef" in env_of(redis)["REDIS_PASSWORD"]["valueFrom"]
    mounts = {m["name"]: m["mountPath"] for m in redis["volumeMounts"]}
    assert mounts["data"] == "/data"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"


# --------------------------------------------------------------------------- containers


@pytest.mark.parametrize("name", VALUES_FILES)
def test_every_container_is_bounded_probed_and_non_root(render: Render, name: str) -> None:
    problems: list[str] = []
    for doc, spec in pod_specs(render(name)):
        pod_sc = spec.get("securityContext", {})
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{doc['metadata']['name']}: mounts a service account token")
        long_running = doc["kind"] != "Job"
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{doc['kind']}/{doc['metadata']['name']}/{c['name']}"
            res = c.get("resources", {})
            if not res.get("requests") or "memory" not in res.get("limits", {}):
                problems.append(f"{where}: no requests or no memory limit")
            sc = {**pod_sc, **c.get("securityContext", {})}
            if sc.get("runAsNonRoot") is not True or sc.get("runAsUser", 0) == 0:
                problems.append(f"{where}: may run as root")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: writable root filesystem")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allows privilege escalation")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: keeps capabilities")
            is_init = c in spec.get("initContainers", [])
            if long_running and not is_init:
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if probe not in c:
                        problems.append(f"{where}: no {probe}")
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_coordinator_defaults(render: Render) -> None:
    r = render("default")
    dep = r.get("Deployment", f"{FULLNAME}-coordinator")
    assert dep["spec"]["replicas"] >= 2
    c = container(dep["spec"]["template"]["spec"], "coordinator")
    port = c["ports"][0]["containerPort"]
    assert c["ports"][0]["name"] == "grpc"
    # Readiness is the gRPC health service's overall status; liveness the cheap /healthz.
    assert c["readinessProbe"]["grpc"] == {"port": port, "service": ""}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert env_of(c)["SHARDQ_LISTEN"]["value"] == f"0.0.0.0:{port}"
    pdb = r.get("PodDisruptionBudget", f"{FULLNAME}-coordinator")
    assert pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]
    assert not r.kind("HorizontalPodAutoscaler")
    assert not r.kind("NetworkPolicy")


def test_autoscaling_replaces_fixed_replicas(render: Render) -> None:
    r = render("autoscaling")
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h for h in r.kind("HorizontalPodAutoscaler")}
    assert set(hpas) == {f"{FULLNAME}-coordinator", f"{FULLNAME}-worker-default"}
    for target, hpa in hpas.items():
        assert "replicas" not in r.get("Deployment", target)["spec"], target
        assert hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert hpas[f"{FULLNAME}-coordinator"]["spec"]["minReplicas"] == 3
    assert r.get("Deployment", f"{FULLNAME}-worker-steady")["spec"]["replicas"] == 2


# --------------------------------------------------------------------------- secrets


def test_generated_secrets_are_random_and_never_defaults(
    helm: str, yaml_mod: ModuleType, render: Render
) -> None:
    first = render("default")
    proc = run_helm(helm, *template_args([]))
    assert proc.returncode == 0, proc.stderr
    second = Rendered("default (again)", [d for d in yaml_mod.safe_load_all(proc.stdout) if d])
    secrets = first.kind("Secret")
    assert {s["metadata"]["name"] for s in secrets} == {
        f"{FULLNAME}-redis",
        f"{FULLNAME}-worker-token",
        f"{FULLNAME}-postgresql",
    }
    for s in secrets:
        again = second.get("Secret", s["metadata"]["name"])
        assert "stringData" not in s
        for key, b64 in s["data"].items():
            value = base64.b64decode(b64)
            assert len(value) >= 32, f"{s['metadata']['name']}.{key} is short"
            assert value != base64.b64decode(again["data"][key]), (
                f"{s['metadata']['name']}.{key} is the same in two renders: a default"
            )


@pytest.mark.parametrize("name", VALUES_FILES)
def test_credentials_reach_containers_only_from_secrets(render: Render, name: str) -> None:
    for doc, spec in pod_specs(render(name)):
        for c in spec.get("initContainers", []) + spec["containers"]:
            for var, e in env_of(c).items():
                # A duration (SHARDQ_TOKEN_CACHE_TTL_S) is not a credential.
                if not re.search(r"PASSWORD|TOKEN|AUTH|DATABASE_URL", var) or var.endswith("_S"):
                    continue
                where = f"{doc['metadata']['name']}/{c['name']}/{var}"
                if "valueFrom" in e:
                    assert "secretKeyRef" in e["valueFrom"], where
                else:
                    # Only a URL composed by Kubernetes from a Secret-backed variable: the
                    # migrator's password, or (databaseRoles) the process's role's.
                    assert var == "SHARDQ_DATABASE_URL", where
                    used = re.search(r":\$\((SHARDQ_DB_(?:ROLE_)?PASSWORD)\)@", e["value"])
                    assert used is not None, where
                    assert "secretKeyRef" in env_of(c)[used.group(1)]["valueFrom"], where


def test_existing_secrets_are_used_not_created(render: Render) -> None:
    r = render("external-db")
    assert not r.kind("Secret"), [s["metadata"]["name"] for s in r.kind("Secret")]
    assert not any(d["metadata"]["name"].endswith("postgresql") for d in r.docs)
    dep = r.get("Deployment", f"{FULLNAME}-worker-default")
    env = env_of(container(dep["spec"]["template"]["spec"], "worker"))
    refs = {
        k: env[k]["valueFrom"]["secretKeyRef"]["name"]
        for k in ("SHARDQ_DATABASE_URL", "SHARDQ_REDIS_PASSWORD", "SHARDQ_WORKER_TOKEN")
    }
    assert refs == {
        "SHARDQ_DATABASE_URL": "shardq-database",
        "SHARDQ_REDIS_PASSWORD": "shardq-redis",
        "SHARDQ_WORKER_TOKEN": "shardq-worker-token",
    }


# --------------------------------------------------------------------------- hooks


def database_secret_ready_before(r: Rendered, job: Doc) -> None:
    """The Secret the Job reads its URL from exists when the Job runs."""
    env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    ref = env["SHARDQ_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"]
    secret = r.by_key.get(("Secret", ref))
    if secret is None:
        return  # existingSecret: created by the operator before install
    assert hook_phases(secret) >= hook_phases(job) & {"pre-install", "pre-upgrade"}
    assert hook_weight(secret) < hook_weight(job)


@pytest.mark.parametrize("name", ["external-db", "everything"])
def test_external_database_is_migrated_before_install_and_upgrade(
    render: Render, name: str
) -> None:
    r = render(name)
    migrate = r.get("Job", f"{FULLNAME}-migrate")
    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    command = container(migrate["spec"]["template"]["spec"], "migrate")["command"]
    assert command == ["shardq", "migrate"]
    # pre-* hooks finish before any release resource (the coordinator) is created or updated.
    assert hook_phases(migrate) == {"pre-install", "pre-upgrade"}
    assert hook_phases(sync) == {"post-install", "post-upgrade"}
    assert hook_weight(migrate) < hook_weight(sync)
    database_secret_ready_before(r, migrate)
    coordinator = r.get("Deployment", f"{FULLNAME}-coordinator")
    assert "initContainers" not in coordinator["spec"]["template"]["spec"]


def test_bundled_database_is_migrated_before_the_coordinator_starts(render: Render) -> None:
    r = render("one-shard")
    migrate = r.get("Job", f"{FULLNAME}-migrate")
    sync = r.get("Job", f"{FULLNAME}-shards-sync")
    # Upgrades migrate before the new pods roll out; the first install cannot (no Postgres yet):
    # there the pods migrate in an init container, and the hook runs after them, before the sync.
    assert hook_phases(migrate) == {"post-install", "pre-upgrade"}
    assert hook_weight(migrate) < hook_weight(sync)
    for dep in [r.get("Deployment", f"{FULLNAME}-coordinator"), *worker_deployments(r)]:
        (init,) = dep["spec"]["template"]["spec"]["initContainers"]
        assert init["command"] == ["shardq", "migrate"], dep["metadata"]["name"]


@pytest.mark.parametrize("name", VALUES_FILES)
def test_hooks_are_cleaned_up_and_bounded(render: Render, name: str) -> None:
    for job in render(name).kind("Job"):
        policy = job["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
        assert "before-hook-creation" in policy
        assert job["spec"]["activeDeadlineSeconds"] > 0
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


# --------------------------------------------------------------------------- workers


@pytest.mark.parametrize("name", [n for n in VALUES_FILES if n != "default"])
def test_worker_grace_period_covers_the_drain(
    render: Render, yaml_mod: ModuleType, name: str
) -> None:
    r = render(name)
    values = values_of(name, yaml_mod)
    workers = values["workers"]
    deps = {d["metadata"]["name"]: d for d in worker_deployments(r)}
    assert set(deps) == {f"{FULLNAME}-worker-{g['name']}" for g in workers["groups"]}
    for g in workers["groups"]:
        spec = deps[f"{FULLNAME}-worker-{g['name']}"]["spec"]["template"]["spec"]
        env = env_of(container(spec, "worker"))
        drain = int(env["SHARDQ_DRAIN_GRACE_S"]["value"])
        assert drain == g.get("drainGraceSeconds", workers["drainGraceSeconds"])
        assert spec["terminationGracePeriodSeconds"] >= drain + workers["terminationMarginSeconds"]
        assert env["SHARDQ_HANDLERS"]["value"] == g["handlers"]
        assert env["SHARDQ_QUEUES"]["value"] == ",".join(g.get("queues", ["default"]))
        assert env["SHARDQ_CONCURRENCY"]["value"] == str(g.get("concurrency", 16))


def test_worker_groups_are_separate_deployments(render: Render) -> None:
    r = render("two-worker-groups")
    fast = r.get("Deployment", f"{FULLNAME}-worker-fast")
    reports = r.get("Deployment", f"{FULLNAME}-worker-reports")
    assert fast["spec"]["selector"] != reports["spec"]["selector"]
    assert fast["spec"]["replicas"] == 4
    rspec = reports["spec"]["template"]["spec"]
    assert rspec["terminationGracePeriodSeconds"] == 615
    assert container(rspec, "worker")["image"] == "registry.example.com/myapp-workers:2024.06.1"
    assert rspec["nodeSelector"] == {"workload": "batch"}
    assert container(rspec, "worker")["resources"]["limits"]["memory"] == "4Gi"


def test_each_worker_group_claims_its_own_queues(render: Render) -> None:
    r = render("two-worker-groups")
    queues = {
        d["metadata"]["name"]: env_of(container(d["spec"]["template"]["spec"], "worker"))[
            "SHARDQ_QUEUES"
        ]["value"]
        for d in worker_deployments(r)
    }
    assert queues == {f"{FULLNAME}-worker-fast": "default", f"{FULLNAME}-worker-reports": "reports"}
    several = render("autoscaling")
    steady = several.get("Deployment", f"{FULLNAME}-worker-steady")
    env = env_of(container(steady["spec"]["template"]["spec"], "worker"))
    assert env["SHARDQ_QUEUES"]["value"] == "steady,steady.low"


@pytest.mark.parametrize("name", [n for n in VALUES_FILES if n != "default"])
def test_workers_dial_the_coordinator_service(render: Render, name: str) -> None:
    r = render(name)
    svc = r.get("Service", f"{FULLNAME}-coordinator")
    (grpc,) = [p for p in svc["spec"]["ports"] if p["name"] == "grpc"]
    expected = f"{FULLNAME}-coordinator.{NAMESPACE}.svc.cluster.local:{grpc['port']}"
    for d in worker_deployments(r):
        env = env_of(container(d["spec"]["template"]["spec"], "worker"))
        assert env["SHARDQ_COORDINATOR"]["value"] == expected


# --------------------------------------------------------------------------- TLS and policies


@pytest.mark.parametrize("name", ["tls", "everything"])
def test_tls_for_grpc(render: Render, name: str) -> None:
    r = render(name)
    spec = r.get("Deployment", f"{FULLNAME}-coordinator")["spec"]["template"]["spec"]
    c = container(spec, "coordinator")
    env = env_of(c)
    mount = next(m for m in c["volumeMounts"] if m["name"] == "tls")
    assert env["SHARDQ_TLS_CERT_FILE"]["value"] == f"{mount['mountPath']}/tls.crt"
    assert env["SHARDQ_TLS_KEY_FILE"]["value"] == f"{mount['mountPath']}/tls.key"
    vol = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert vol["secret"]["secretName"] == "shardq-coordinator-tls"
    # The kubelet's gRPC probe cannot speak TLS: readiness is read from /readyz instead (not a
    # TCP check, which passes while the coordinator is not ready).
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "grpc" not in c["readinessProbe"]
    for d in worker_deployments(r):
        wspec = d["spec"]["template"]["spec"]
        w = container(wspec, "worker")
        ca_mount = next(m for m in w["volumeMounts"] if m["name"] == "tls-ca")
        assert env_of(w)["SHARDQ_TLS_CA_FILE"]["value"] == f"{ca_mount['mountPath']}/ca.crt"
        ca_vol = next(v for v in wspec["volumes"] if v["name"] == "tls-ca")
        assert ca_vol["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]


def pods_by_component(r: Rendered) -> dict[str, dict[str, str]]:
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]["metadata"]["labels"]
        for doc, _ in pod_specs(r)
    }


def allowed_peers(r: Rendered, policy: Doc, port: str) -> set[str]:
    """Names of the workloads whose pods may reach `port` of the policy's pods."""
    pods = pods_by_component(r)
    allowed: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        if port not in {p["port"] for p in rule.get("ports", [])}:
            continue
        assert "from" in rule, f"{policy['metadata']['name']}: {port} open to everyone"
        for peer in rule["from"]:
            sel = peer["podSelector"]["matchLabels"]
            allowed |= {name for name, labels in pods.items() if sel.items() <= labels.items()}
    return allowed


@pytest.mark.parametrize("name", ["bundled-netpol", "everything"])
def test_network_policies_fence_redis_and_postgres(render: Render, name: str) -> None:
    r = render(name)
    clients = {f"{FULLNAME}-coordinator", *(d["metadata"]["name"] for d in worker_deployments(r))}
    redis_policy = r.get("NetworkPolicy", f"{FULLNAME}-shard")
    hooks = {f"{FULLNAME}-shards-sync", f"{FULLNAME}-moves"}
    assert allowed_peers(r, redis_policy, "redis") == clients | hooks
    if name == "bundled-netpol":
        pg_policy = r.get("NetworkPolicy", f"{FULLNAME}-postgresql")
        # The shard loops too: they write the result rows of jobs that end without a worker.
        assert allowed_peers(r, pg_policy, "postgresql") == clients | hooks | {
            f"{FULLNAME}-migrate",
            f"{FULLNAME}-shard",
        }
    else:
        assert ("NetworkPolicy", f"{FULLNAME}-postgresql") not in r.by_key


@pytest.mark.parametrize("name", ["bundled-netpol", "everything"])
def test_metrics_ports_are_open_only_to_the_monitoring_namespace(render: Render, name: str) -> None:
    """/metrics names tenants and handlers: every policy lets only networkPolicy.metricsFrom
    (by default the namespace named monitoring) reach a metrics port; the coordinator's gRPC
    port stays open to every client."""
    r = render(name)
    monitoring = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    policies = {p["metadata"]["name"]: p for p in r.kind("NetworkPolicy")}
    assert {f"{FULLNAME}-shard", f"{FULLNAME}-worker", f"{FULLNAME}-coordinator"} <= set(policies)
    seen = 0
    for policy in policies.values():
        for rule in policy["spec"]["ingress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports & {"metrics", "standby-metrics"}:
                assert rule.get("from") == monitoring, policy["metadata"]["name"]
                seen += 1
    assert seen >= 3
    grpc_rules = [
        rule
        for rule in policies[f"{FULLNAME}-coordinator"]["spec"]["ingress"]
        if {p["port"] for p in rule["ports"]} == {"grpc"}
    ]
    assert grpc_rules == [{"ports": [{"port": "grpc", "protocol": "TCP"}]}]
