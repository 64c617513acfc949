"""Where the pods land and how many may go at once: by default coordinators, shards and each
worker group prefer one pod per node and spread over zones (soft, so small clusters still
schedule them); an explicit affinity or spread list replaces the preset; each worker group has
its own PodDisruptionBudget.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from tests.helm.conftest import Doc, Rendered, run_helm, template_args
from tests.helm.test_chart import FULLNAME, pod_specs, worker_deployments

Render = Callable[[str], Rendered]

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def pod_template(doc: Doc) -> Doc:
    template: Doc = doc["spec"]["template"]
    return template


def selects_only(selector: dict[str, Any], r: Rendered, workload: str) -> None:
    """The label selector matches the pods of `workload` and of no other workload."""
    labels = {d["metadata"]["name"]: pod_template(d)["metadata"]["labels"] for d, _ in pod_specs(r)}
    want = selector["matchLabels"]
    matched = {name for name, have in labels.items() if want.items() <= have.items()}
    assert matched == {workload}, f"{want} selects {sorted(matched)}, not only {workload}"


def soft_anti_affinity_term(spec: Doc) -> Doc:
    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    (term,) = terms
    assert 1 <= term["weight"] <= 100
    assert term["podAffinityTerm"]["topologyKey"] == HOSTNAME
    body: Doc = term["podAffinityTerm"]
    return body


@pytest.mark.parametrize("name", ["default", "two-worker-groups"])
def test_coordinators_shards_and_workers_prefer_distinct_nodes_and_zones(
    render: Render, name: str
) -> None:
    r = render(name)
    workloads = [
        r.get("Deployment", f"{FULLNAME}-coordinator"),
        r.get("StatefulSet", f"{FULLNAME}-shard"),
        *worker_deployments(r),
    ]
    for doc in workloads:
        spec = pod_template(doc)["spec"]
        workload = doc["metadata"]["name"]
        # Soft: a preference, never a requirement, so a one-node cluster still runs them all.
        assert set(spec["affinity"]) == {"podAntiAffinity"}, workload
        assert set(spec["affinity"]["podAntiAffinity"]) == {
            "preferredDuringSchedulingIgnoredDuringExecution"
        }, workload
        selects_only(soft_anti_affinity_term(spec)["labelSelector"], r, workload)
        (spread,) = spec["topologySpreadConstraints"]
        assert spread["topologyKey"] == ZONE, workload
        assert spread["whenUnsatisfiable"] == "ScheduleAnyway", workload
        assert spread["maxSkew"] == 1, workload
        selects_only(spread["labelSelector"], r, workload)


def test_an_explicit_affinity_or_spread_list_replaces_the_presets(render: Render) -> None:
    r = render("placement")
    coord = pod_template(r.get("Deployment", f"{FULLNAME}-coordinator"))["spec"]
    # The user's affinity, whole: no anti-affinity preset merged into it.
    assert coord["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "node-role.example.com/frontdoor", "operator": "Exists"}
                        ]
                    }
                ]
            }
        }
    }
    # The user's constraint instead of the zone preset, given the coordinator's labels.
    (spread,) = coord["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["whenUnsatisfiable"]) == (HOSTNAME, "DoNotSchedule")
    selects_only(spread["labelSelector"], r, f"{FULLNAME}-coordinator")

    shard = pod_template(r.get("StatefulSet", f"{FULLNAME}-shard"))["spec"]
    anti = shard["affinity"]["podAntiAffinity"]
    (required,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["topologyKey"] == HOSTNAME
    selects_only(required["labelSelector"], r, f"{FULLNAME}-shard")
    assert "topologySpreadConstraints" not in shard
    assert shard["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "shards", "effect": "NoSchedule"}
    ]

    # The workers.* presets (none, hard) for every group but the one that sets its own (soft).
    default = pod_template(r.get("Deployment", f"{FULLNAME}-worker-default"))["spec"]
    assert "affinity" not in default
    assert default["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "DoNotSchedule"
    reports = pod_template(r.get("Deployment", f"{FULLNAME}-worker-reports"))["spec"]
    selects_only(soft_anti_affinity_term(reports)["labelSelector"], r, f"{FULLNAME}-worker-reports")
    assert reports["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"


def test_presets_turned_off_leave_placement_to_the_scheduler(
    helm: str, yaml_mod: ModuleType
) -> None:
    sets = [
        f"{part}.{preset}=none"
        for part in ("coordinator", "shards")
        for preset in ("podAntiAffinityPreset", "zoneSpreadPreset")
    ]
    args: list[str] = []
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *template_args([], args))
    assert proc.returncode == 0, proc.stderr
    r = Rendered("presets off", [d for d in yaml_mod.safe_load_all(proc.stdout) if d])
    for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "shard")):
        spec = pod_template(r.get(kind, f"{FULLNAME}-{name}"))["spec"]
        assert "affinity" not in spec, name
        assert "topologySpreadConstraints" not in spec, name


# --------------------------------------------------------------------------- worker budgets


def budgets(r: Rendered) -> dict[str, Doc]:
    return {
        p["metadata"]["name"]: p["spec"]
        for p in r.kind("PodDisruptionBudget")
        if "shardq.io/worker-group" in p["metadata"]["labels"]
    }


@pytest.mark.parametrize("name", ["two-worker-groups", "autoscaling", "tls"])
def test_each_worker_group_has_its_own_disruption_budget(render: Render, name: str) -> None:
    r = render(name)
    deps = worker_deployments(r)
    assert deps
    pdbs = budgets(r)
    assert set(pdbs) == {d["metadata"]["name"] for d in deps}
    for d in deps:
        spec = pdbs[d["metadata"]["name"]]
        # The same pods as its Deployment, and those only.
        assert spec["selector"] == d["spec"]["selector"]
        selects_only(spec["selector"], r, d["metadata"]["name"])
        # By default one worker of the group at a time: each drains before it exits.
        assert spec == {"maxUnavailable": 1, "selector": d["spec"]["selector"]}


def test_worker_budgets_follow_workers_pdb_and_each_groups_own(render: Render) -> None:
    pdbs = budgets(render("placement"))
    assert set(pdbs) == {f"{FULLNAME}-worker-default", f"{FULLNAME}-worker-reports"}
    default = pdbs[f"{FULLNAME}-worker-default"]
    assert default["minAvailable"] == "50%"
    assert "maxUnavailable" not in default
    # The group's own budget replaces workers.pdb's whole (not both at once).
    reports = pdbs[f"{FULLNAME}-worker-reports"]
    assert reports["maxUnavailable"] == 2
    assert "minAvailable" not in reports
