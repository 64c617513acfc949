"""The dashboard as the chart deploys it: off by default; when on, a Deployment whose
variables the dashboard's own parser reads into the settings meant, and a Service that
selects its pods."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from shardq.coordinator.dashboard import server
from tests.helm.conftest import Doc, Rendered, run_helm, template_args
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


def dashboard_args(c: Doc, monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """What the dashboard's own parser reads from the container's variables."""
    for name, e in env_of(c).items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    parser = argparse.ArgumentParser()
    server.add_arguments(parser)
    return parser.parse_args([])


def test_behind_the_charts_tls_ingress_with_mtls_and_two_replicas(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TLS Ingress: the dashboard believes X-Forwarded-Proto (so its cookie is Secure);
    tls.clientAuth: it presents the client certificate mounted from its own Secret; two
    replicas: a user's requests stay on the replica that holds their session."""
    r = render("dashboard-ingress")
    pod = r.get("Deployment", NAME)["spec"]["template"]["spec"]
    c = container(pod, "dashboard")
    args = dashboard_args(c, monkeypatch)
    assert server.proxy_settings(args.forwarded_allow_ips) == {
        "proxy_headers": True,
        "forwarded_allow_ips": ["*"],
    }
    settings_args = (args.client_cert_file, args.client_key_file)
    assert settings_args == ("/etc/shardq/client/tls.crt", "/etc/shardq/client/tls.key")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["client-cert"] == "/etc/shardq/client"
    volume = next(v for v in pod["volumes"] if v["name"] == "client-cert")
    assert volume["secret"]["secretName"] == "shardq-dashboard-client"
    assert {i["key"] for i in volume["secret"]["items"]} == {"tls.crt", "tls.key"}
    assert (args.dashboard_session_idle_s, args.dashboard_session_max_age_s) == (3600, 43200)

    ingress = r.get("Ingress", NAME)
    tls = [{"hosts": ["jobs.example.com"], "secretName": "dashboard-tls"}]
    assert ingress["spec"]["tls"] == tls
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": NAME, "port": {"name": "http"}}
    # ingress-nginx balances over the pods itself, past the Service's affinity.
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/affinity"] == "cookie"
    svc = r.get("Service", NAME)["spec"]
    assert svc["sessionAffinity"] == "ClientIP"
    assert svc["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"] == 43200


def test_one_replica_no_ingress_trusts_no_proxy_and_needs_no_affinity(
    render: Render, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = render("dashboard")
    c = container(r.get("Deployment", NAME)["spec"]["template"]["spec"], "dashboard")
    assert "SHARDQ_FORWARDED_ALLOW_IPS" not in env_of(c)
    assert server.proxy_settings(dashboard_args(c, monkeypatch).forwarded_allow_ips) == {
        "proxy_headers": False,
        "forwarded_allow_ips": [],
    }
    assert "sessionAffinity" not in r.get("Service", NAME)["spec"]
    assert not r.kind("Ingress")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["tls.enabled=true", "tls.existingSecret=s", "tls.clientAuth=true"],
            "dashboard.clientCertSecret: required with tls.clientAuth",
        ),
        (["dashboard.ingress.enabled=true", "dashboard.ingress.tls.enabled=true"],
         "dashboard.ingress.host: required"),
        (["dashboard.forwardedAllowIps=ingress-nginx"], "dashboard.forwardedAllowIps"),
    ],
)  # fmt: skip
def test_dashboard_values_that_cannot_work_are_refused(
    helm: str, sets: list[str], message: str
) -> None:
    args = ["--set", "dashboard.enabled=true"]
    for s in sets:
        args += ["--set", s]
    proc = run_helm(helm, *template_args([], args))
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
