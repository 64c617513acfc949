"""The dashboard as the chart deploys it: off by default; when on, a Deployment whose
variables the dashboard's own parser reads into the settings meant, and a Service that
selects its pods."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from shardq.coordinator.dashboard import server
from tests.helm.conftest import Rendered
from tests.helm.test_chart import FULLNAME, container, env_of

Render = Callable[[str], Rendered]
NAME = f"{FULLNAME}-dashboard"


def test_off_by_default(render: Render) -> None:
    r = render("default")
    assert not [d for d in r.docs if d["metadata"]["name"] == NAME]


def test_on_it_reaches_the_coordinator_with_the_settings_given(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = render("dashboard")
    dep = r.get("Deployment", NAME)
    pod = dep["spec"]["template"]["spec"]
    c = container(pod, "dashboard")
    assert c["command"] == ["shardq-dashboard"]
    env = {name: e["value"] for name, e in env_of(c).items() if "value" in e}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    args = parser.parse_args([])
    assert args.dashboard_listen == "0.0.0.0:8080"
    assert args.coordinator == f"{FULLNAME}-coordinator.jobs.svc.cluster.local:50051"
    # tls.enabled: the coordinator is verified with the chart's CA, mounted where it is read.
    assert args.ca_file == "/etc/shardq/tls/ca.crt"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["tls"] == "/etc/shardq/tls"
    assert args.dashboard_sample_interval_s == 10
    # Probes ask what the dashboard serves, on the port it listens on.
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    # Only the CA of the TLS secret is mounted, never the coordinator's key.
    tls = next(v for v in pod["volumes"] if v["name"] == "tls")
    assert tls["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]

    svc = r.get("Service", NAME)
    assert svc["spec"]["ports"][0]["port"] == 8080
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
